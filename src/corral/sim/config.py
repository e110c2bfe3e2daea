"""The simulator's settings (`SimConfig`): one frozen value built by the CLI and handed to every part."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SimConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "sim-model"
    max_model_len: int = 2048
    max_num_seqs: int = 64
    block_size: int = 16
    kv_cache_blocks: int = 4096
    startup_seconds: float = 0.0
    prefill_ms_per_token: float = 0.05
    ttft_base_ms: float = 1.0
    itl_ms: float = 2.0
    default_max_tokens: int = 16
    seed: int = 0
    shutdown_timeout: float = 0.0
    fail_rate: float = 0.0
    crash_after: int | None = None
    hang_after: int | None = None
    requires: tuple[str, ...] = field(default_factory=tuple)
    version_string: str = "0.33.0"

    @property
    def kv_cache_tokens(self) -> int:
        return self.kv_cache_blocks * self.block_size

    @property
    def max_prompt_chars(self) -> int:
        """vLLM rejects a prompt before tokenizing when it is longer than this many characters."""
        return self.max_model_len * 6
