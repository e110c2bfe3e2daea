"""The defaults of `WindowThresholds` (corral.contracts.traffic), apart from the model so that the
command lines offering them as flag defaults (`corral verify`, `corral rollout`) show them in `--help`
without loading pydantic."""

from __future__ import annotations

MAX_ERROR_RATIO = 0.05
MAX_TTFT_RATIO = 2.0
TTFT_SLACK_MS = 50.0
MIN_REQUESTS = 20
# the figures judged by one rule, max(baseline × ratio, baseline + slack) (contracts/window_figures.py):
# ITL doubles under a bad kernel or a batch that no longer fits; the slack is vLLM's histogram resolution
# (its ITL buckets end at 10, 25, 50 ms: a p99 moving up one bucket there is not a regression)
MAX_ITL_RATIO = 2.0
ITL_SLACK_MS = 25.0
# the queue (vllm:num_requests_waiting, mean per engine) doubling and by more than a few requests
MAX_QUEUE_RATIO = 2.0
QUEUE_SLACK = 4.0
# KV cache utilization (0-1, mean per engine): 25 points above the baseline's, whatever the baseline
KV_USAGE_RISE = 0.25
# GPU memory held (per engine, the window's highest reading): vLLM takes a fixed share
# (--gpu-memory-utilization), so more than 10% and 1 GiB above the baseline is memory the new engine
# should not hold (a leak, a bigger graph pool, a second copy of the weights)
MAX_GPU_MEMORY_RATIO = 1.10
GPU_MEMORY_SLACK_GIB = 1.0
