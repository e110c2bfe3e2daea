"""Every vLLM metric name Corral reads or the simulator exposes, spelled once: the router's load board,
the supervisor's stall and drain evidence, the runbook's sleep and adapter checks, `corral status` and
`corral doctor` read them; `corral sim` declares them; the conformance tests hold both to this table.

Sample names are given as they appear in the text (counters end in `_total`, histograms are families
whose samples add `_bucket`, `_count`, `_sum`); labels are vLLM's `model_name` and `engine`.
"""

from __future__ import annotations

PREFIX = "vllm:"

# gauges
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"  # label `reason`: capacity | deferred
KV_USAGE = "vllm:kv_cache_usage_perc"  # 0-1, the highest over data-parallel engines matters
KV_USAGE_BEFORE_RENAME = "vllm:gpu_cache_usage_perc"  # vLLM before kv_cache_usage_perc; read as a fallback
SLEEP_STATE = "vllm:engine_sleep_state"  # label `sleep_state`: awake | weights_offloaded | discard_all
LORA_INFO = "vllm:lora_requests_info"  # labels running/waiting_lora_adapters, max_lora; value: a timestamp
LORA_RUNNING_LABEL = "running_lora_adapters"
LORA_WAITING_LABEL = "waiting_lora_adapters"
# value 1; its labels are the engine's CacheConfig: `num_gpu_blocks` (the KV cache's size in blocks, fixed
# at start), `block_size`, `gpu_memory_utilization`, ... (one series per engine core)
CACHE_CONFIG_INFO = "vllm:cache_config_info"

# counters (sample names; the family is the name without `_total`)
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
FINISHED = "vllm:request_success_total"  # label `finished_reason`: stop | length | abort | error

# histogram families
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
E2E_LATENCY = "vllm:e2e_request_latency_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"

GAUGES = (RUNNING, WAITING, WAITING_BY_REASON, KV_USAGE, SLEEP_STATE, LORA_INFO, CACHE_CONFIG_INFO)
COUNTERS = (PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS, PREEMPTIONS, PROMPT_TOKENS, GENERATION_TOKENS, FINISHED)
HISTOGRAMS = (TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY, E2E_LATENCY, QUEUE_TIME)
# What a current vLLM exposes and Corral relies on (the simulator exposes all of these too).
EXPOSED = GAUGES + COUNTERS + HISTOGRAMS
# The sample names of those that every engine shows (lora_requests_info needs --enable-lora), as the
# conformance tests compare them between a real engine and `corral sim`.
ALWAYS_EXPOSED_SAMPLES = (
    tuple(g for g in GAUGES if g != LORA_INFO)
    + COUNTERS
    + tuple(h + suffix for h in HISTOGRAMS for suffix in ("_bucket", "_count", "_sum"))
)

# Only `corral sim` exposes these: a real engine's GPU memory comes from the device.
SIM_GPU_MEMORY = "corral_sim_gpu_memory_bytes"  # label `kind`: weights | kv_cache
SIM_CPU_BACKUP = "corral_sim_cpu_backup_bytes"
SIM_WEIGHTS_VALID = "corral_sim_weights_valid"
SIM_PREFIX_CACHE_BLOCKS = "corral_sim_prefix_cache_blocks"  # blocks cached now
SIM_PREFIX_CACHE_RESETS = "corral_sim_prefix_cache_resets_total"  # whole-cache resets since start

# vLLM's NIXL connector families (kv_connector/v1/nixl/stats.py), shown by an engine with a NIXL
# --kv-transfer-config; xfer time and bytes are histograms observed by the engine that pulls (decode),
# expired requests are counted on the prefill engine whose held blocks timed out.
NIXL_XFER_TIME = "vllm:nixl_xfer_time_seconds"
NIXL_POST_TIME = "vllm:nixl_post_time_seconds"
NIXL_BYTES_TRANSFERRED = "vllm:nixl_bytes_transferred"
NIXL_NUM_DESCRIPTORS = "vllm:nixl_num_descriptors"
NIXL_FAILED_TRANSFERS = "vllm:nixl_num_failed_transfers_total"
NIXL_FAILED_NOTIFICATIONS = "vllm:nixl_num_failed_notifications_total"
NIXL_KV_EXPIRED_REQS = "vllm:nixl_num_kv_expired_reqs_total"
NIXL_NOTIFICATIONS_AFTER_EXPIRY = "vllm:nixl_num_notifications_after_expiry_total"
# A prompt's tokens by where their KV came from (label `source`): local_compute | local_cache_hit |
# external_kv_transfer; a decode engine counts a transferred prompt under external_kv_transfer, while
# vllm:prompt_tokens_total counts every prompt token whatever its source.
PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
NIXL_COUNTERS = (
    NIXL_FAILED_TRANSFERS,
    NIXL_FAILED_NOTIFICATIONS,
    NIXL_KV_EXPIRED_REQS,
    NIXL_NOTIFICATIONS_AFTER_EXPIRY,
)
NIXL_HISTOGRAMS = (NIXL_XFER_TIME, NIXL_POST_TIME, NIXL_BYTES_TRANSFERRED, NIXL_NUM_DESCRIPTORS)

# Only `corral sim` exposes these (a real engine keeps them inside its connector); a drain reads them.
SIM_KV_TRANSFERS_HELD = "corral_sim_kv_transfers_held"  # prefill: requests whose blocks await a pull
SIM_KV_PULLS_IN_FLIGHT = "corral_sim_kv_pulls_in_flight"  # decode: pulls started, not finished
# A decode (kv consumer) engine's waiting requests by KV pull stage (label `stage`: waiting_to_start |
# in_progress | completed_waiting; v1/metrics/loggers.py); a drain reads the first two as pulls.
KV_FETCH_BY_STAGE = "vllm:num_requests_kv_fetch_by_stage"


def family(sample_name: str) -> str:
    """The metric family a counter sample belongs to (`vllm:prompt_tokens_total` → `vllm:prompt_tokens`)."""
    return sample_name.removesuffix("_total")
