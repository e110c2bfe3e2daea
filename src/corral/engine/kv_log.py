"""What vLLM's startup log says about the engine's memory: the KV cache size in tokens
(`GPU KV cache size: 123,456 tokens`; `CPU KV cache size: ...` on a CPU engine), the weights' share
(`Model loading took 0.93 GiB memory ...`) and the KV cache's share (`Available KV cache memory: 30.5
GiB`) of each rank's GPU; and the comparison of the logged KV size with the memory budget."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

GIB = 2**30

# vLLM (v1/core/kv_cache_utils.py) logs "<device> KV cache size: N tokens" once per engine core, with
# the count formatted with thousands separators; later versions add ", Maximum concurrency ..." on it.
_KV_SIZE = re.compile(r"\b([A-Z][A-Za-z]*) KV cache size: ([\d,]+) tokens")
# vLLM's gpu_model_runner and gpu_worker, once per rank
_WEIGHTS = re.compile(r"Model loading took ([\d.]+) GiB")
_KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")

# A logged KV size below the budget's expectation by more than this share is a shortfall: the budget
# estimates activation, CUDA graph and NCCL headroom that vLLM measures by profiling.
KV_SHORTFALL_TOLERANCE = 0.10


@dataclass(frozen=True)
class KvCacheSize:
    device: str  # GPU, CPU, XPU, ...
    tokens: int


def kv_cache_size(line: str) -> KvCacheSize | None:
    """The KV cache size a vLLM log line announces, or None for any other line."""
    found = _KV_SIZE.search(line)
    if found is None:
        return None
    return KvCacheSize(found.group(1), int(found.group(2).replace(",", "")))


def _gib(pattern: re.Pattern[str], line: str) -> int | None:
    found = pattern.search(line)
    return int(float(found.group(1)) * GIB) if found is not None else None


class EngineLogFigures:
    """The memory figures one run of the engine has logged so far (a new run starts empty)."""

    def __init__(self) -> None:
        self.kv_cache: KvCacheSize | None = None
        self.weights_bytes: int | None = None  # per rank (the ranks of a TP group hold equal shares)
        self.kv_cache_bytes: int | None = None  # per rank

    def note(self, line: str) -> bool:
        """Read one engine log line; True when it carried a figure."""
        size = kv_cache_size(line)
        if size is not None:
            # data-parallel engine cores each log their own: the smallest is what a request can count on
            if self.kv_cache is None or size.tokens < self.kv_cache.tokens:
                self.kv_cache = size
            return True
        weights = _gib(_WEIGHTS, line)
        if weights is not None:
            self.weights_bytes = max(weights, self.weights_bytes or 0)
            return True
        kv = _gib(_KV_MEMORY, line)
        if kv is not None:
            self.kv_cache_bytes = kv if self.kv_cache_bytes is None else min(kv, self.kv_cache_bytes)
            return True
        return False

    @property
    def kv_cache_tokens(self) -> int | None:
        return self.kv_cache.tokens if self.kv_cache is not None else None

    def to_json(self) -> dict[str, Any]:
        return {
            "kv_cache_tokens": self.kv_cache_tokens,
            "kv_cache_device": self.kv_cache.device if self.kv_cache is not None else None,
            "weights_bytes_per_rank": self.weights_bytes,
            "kv_cache_bytes_per_rank": self.kv_cache_bytes,
        }


@dataclass(frozen=True)
class KvCapacity:
    """The logged KV size against the budget: `outcome` passed | failed | not_measured."""

    outcome: str
    reason: str
    logged_tokens: int | None
    expected_tokens: int | None
    min_tokens: int | None
    tolerance: float

    @property
    def shortfall(self) -> bool:
        return self.outcome == "failed"

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def kv_capacity(
    logged_tokens: int | None,
    expected_tokens: int | None,
    min_tokens: int | None,
    tolerance: float = KV_SHORTFALL_TOLERANCE,
) -> KvCapacity:
    """Compare vLLM's logged KV size with the budget's `expected_kv_tokens` (beyond `tolerance`) and
    `min_kv_tokens` (one `--max-model-len` sequence): below either is a shortfall."""

    def verdict(outcome: str, reason: str) -> KvCapacity:
        return KvCapacity(outcome, reason, logged_tokens, expected_tokens, min_tokens, tolerance)

    if logged_tokens is None:
        return verdict("not_measured", "the engine logged no 'KV cache size: N tokens' line")
    if min_tokens is not None and logged_tokens < min_tokens:
        return verdict(
            "failed",
            f"the engine's KV cache holds {logged_tokens:,} tokens, less than one --max-model-len "
            f"sequence ({min_tokens:,}); lower --max-model-len or raise --gpu-memory-utilization",
        )
    if expected_tokens is None:
        if min_tokens is None:
            return verdict(
                "not_measured",
                f"the engine logged {logged_tokens:,} KV tokens; no memory budget to compare with",
            )
        return verdict("passed", f"{logged_tokens:,} KV tokens, at least one sequence of {min_tokens:,}")
    floor = expected_tokens * (1.0 - tolerance)
    if logged_tokens < floor:
        short = 1.0 - logged_tokens / expected_tokens
        return verdict(
            "failed",
            f"the engine's KV cache holds {logged_tokens:,} tokens, {short:.0%} below the budget's "
            f"{expected_tokens:,} (tolerance {tolerance:.0%}): something else holds GPU memory, or "
            "the budget's headroom is too small (corral supervise --explain)",
        )
    return verdict(
        "passed",
        f"{logged_tokens:,} KV tokens, within {tolerance:.0%} of the budget's {expected_tokens:,} or above",
    )
