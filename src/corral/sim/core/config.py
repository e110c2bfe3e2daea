"""The simulator's settings (`SimConfig`): one frozen value built by the CLI and handed to every part."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from corral.engine.kv_events import KvEventsConfig, parse_kv_events_config
from corral.engine.sim_version import SIM_VLLM_VERSION

KV_BYTES_PER_TOKEN = 128 * 1024
GIB = 2**30


def effective_keys(cli_keys: Sequence[str], environ_key: str | None) -> tuple[str, ...]:
    """vLLM's rule: `--api-key` wins over VLLM_API_KEY; empty values guard nothing."""
    chosen = list(cli_keys) if cli_keys else [environ_key or ""]
    return tuple(k for k in chosen if k)


@dataclass(frozen=True)
class SimConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "sim-model"  # a name, or a checkpoint directory (config.json, *.safetensors)
    served_model_name: str | None = None  # what /v1/models lists; default: --model, as in vLLM
    max_model_len: int = 2048
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # tokens one engine step computes (decodes + prefill chunks)
    block_size: int = 16
    kv_cache_blocks: int = 4096
    startup_seconds: float = 0.0
    prefill_ms_per_token: float = 0.05
    # the API server's rendering and tokenizing, before the engine core counts the request
    render_ms_per_token: float = 0.0
    # vLLM's --enable-prompt-tokens-details: usage.prompt_tokens_details = {"cached_tokens": N}
    enable_prompt_tokens_details: bool = False
    ttft_base_ms: float = 1.0
    itl_ms: float = 2.0
    default_max_tokens: int = 16
    seed: int = 0
    shutdown_timeout: float = 0.0
    fail_rate: float = 0.0
    fail_rate_after: int = 0  # --fail-rate spares the first N inference requests
    crash_after: int | None = None
    hang_after: int | None = None
    gpu_fault: str | None = None  # corral.sim.core.gpu_fault_lines.KINDS
    gpu_fault_after: int = 0
    wrong_answer: str | None = None  # other-model | error-body | no-choices (200, not a completion)
    wrong_answer_after: int = 0
    fail_reload_rank: int | None = None  # collective_rpc reload_weights raises in this worker rank
    fail_wake_tags: tuple[str, ...] = field(default_factory=tuple)
    fail_sleep: bool = False
    # each runtime adapter load takes this many blocks off the KV cache (vllm:cache_config_info shows it)
    fail_lora_kv_blocks: int = 0
    requires: tuple[str, ...] = field(default_factory=tuple)
    version_string: str = SIM_VLLM_VERSION
    # -- the simulated device (no memory arithmetic without --gpu-memory-gib) and its parallel ranks --
    gpu_memory_gib: float | None = None
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    fail_rank: int | None = None
    fail_rank_after_seconds: float = 0.0
    unlogged_rank: int | None = None  # this worker logs nothing: the supervisor never sees it
    # After the engine died (a rank died), how long /health answers 503 before the API server exits 1;
    # vLLM's watchdog looks every 5 s. VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps it up.
    engine_dead_exit_seconds: float = 5.0
    keep_alive_on_engine_death: bool = False
    # -- operational features (all off by default; none of them costs anything per request when off) --
    enable_sleep_mode: bool = False
    weights_gib: float = 1.0
    kv_cache_gib: float | None = None
    memory_metrics: bool = True  # the corral_sim_* memory gauges; off, as vLLM: memory only from the device
    enable_lora: bool = False
    max_loras: int = 1
    lora_modules: tuple[str, ...] = field(default_factory=tuple)
    load_format: str = "auto"
    model_loader_extra_config: str | None = None
    # What pins the artifact, accepted as vLLM accepts them (PRECHECK reads them from the command line);
    # the simulator loads nothing from a hub, so they change no behaviour, only the log of non-default args.
    revision: str | None = None
    tokenizer_revision: str | None = None
    code_revision: str | None = None
    quantization: str | None = None
    chat_template: str | None = None
    trust_remote_code: bool = False
    enforce_eager: bool = False
    # -- prefill/decode disaggregation: vLLM's --kv-transfer-config (JSON) and the simulated transfer --
    kv_transfer_config: str | None = None
    kv_transfer_ms_per_block: float = 0.1
    fail_kv_transfer: float = 0.0  # that fraction of pulls from this (prefill) engine fail
    hang_kv_transfer: bool = False  # pulls from this engine never finish; the lease frees the blocks
    side_channel_host: str | None = None  # VLLM_NIXL_SIDE_CHANNEL_HOST
    # -- KV-cache events: vLLM's --kv-events-config (JSON) and how its block hashes are made --
    kv_events_config: str | None = None
    prefix_caching_hash_algo: str = "sha256"
    hash_seed: str | None = None  # PYTHONHASHSEED, the seed of vLLM's block hashes when set
    # From the environment (read by the CLI, never at import): VLLM_SERVER_DEV_MODE and
    # VLLM_ALLOW_RUNTIME_LORA_UPDATING.
    dev_mode: bool = False
    runtime_lora_updating: bool = False
    # `--api-key` (repeatable) and VLLM_API_KEY, as vLLM takes them (see `api_keys`). Kept out of repr so
    # a printed config never shows them.
    api_key: tuple[str, ...] = field(default_factory=tuple, repr=False)
    env_api_key: str | None = field(default=None, repr=False)

    @property
    def api_keys(self) -> tuple[str, ...]:
        """The keys `/v1...` requests must carry: `--api-key` wins over VLLM_API_KEY; empty guards nothing."""
        return effective_keys(self.api_key, self.env_api_key)

    @property
    def kv_events(self) -> KvEventsConfig | None:
        """`--kv-events-config` when it publishes events on ZMQ; None otherwise."""
        if self.kv_events_config is None:
            return None
        parsed = parse_kv_events_config(self.kv_events_config)
        return parsed if parsed.publishing else None

    @property
    def model_name(self) -> str:
        """The name clients use (`--served-model-name`, else `--model`)."""
        return self.served_model_name or self.model

    @property
    def kv_cache_tokens(self) -> int:
        return self.kv_cache_blocks * self.block_size

    @property
    def max_prompt_chars(self) -> int:
        """vLLM rejects a prompt before tokenizing when it is longer than this many characters."""
        return self.max_model_len * 6

    @property
    def weights_bytes(self) -> int:
        return int(self.weights_gib * GIB)

    @property
    def kv_cache_bytes(self) -> int:
        """`--kv-cache-gib`, or what the KV cache's token capacity would take on a mid-size model."""
        if self.kv_cache_gib is not None:
            return int(self.kv_cache_gib * GIB)
        return self.kv_cache_tokens * KV_BYTES_PER_TOKEN
