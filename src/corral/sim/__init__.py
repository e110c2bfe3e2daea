"""The vLLM-compatible engine simulator (`corral sim`)."""
