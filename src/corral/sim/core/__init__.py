"""The simulated engine itself: scheduler, prefix cache, token generation, sleep state, LoRA, faults."""
