"""The simulator's HTTP surface: vLLM's OpenAI routes, development endpoints, LoRA routes, metrics."""
