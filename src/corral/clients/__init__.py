"""Typed async clients of Corral's own HTTP APIs, and the keys Corral's command lines carry to them."""
