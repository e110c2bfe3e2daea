"""The OpenAI-compatible router (`corral router`): membership, policies, and the proxy data path."""
