"""The defaults of the supervisor's GPU memory checks (corral.supervisor.lifecycle.memory_checks),
apart from them so that `corral supervise --help` shows them without loading the checks."""

from __future__ import annotations

# What a sleeping vLLM keeps on each GPU: the sleep allocator frees only its pool (weights, KV cache);
# the CUDA context (~0.5 GiB), the CUDA graph pool, NCCL buffers and the torch allocator's blocks
# outside the pool stay. vLLM's own sleep test allows more on V1 (a logits buffer it cannot free).
DEFAULT_SLEEP_RESIDUE_GIB = 2.0
# A wake (or reload) must bring each GPU back to within this share of what it held before the sleep.
DEFAULT_WAKE_TOLERANCE = 0.05
