"""The KV cache's size as the engine states it on `/metrics`: `vllm:cache_config_info`'s
`num_gpu_blocks` and `block_size` labels (one series per engine core; the smallest is what a request
can count on). vLLM sizes the KV cache once, at start, after reserving what `--max-loras` adapters
need; the runbook reads it before and after an operation to see that the operation left it whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.engine.metric_names import CACHE_CONFIG_INFO
from corral.engine.metrics_text import samples


@dataclass(frozen=True)
class KvBlocks:
    """The KV cache in blocks (and tokens, where the block size is stated) at one moment."""

    num_gpu_blocks: int
    block_size: int | None

    @property
    def tokens(self) -> int | None:
        return self.num_gpu_blocks * self.block_size if self.block_size is not None else None

    def to_json(self) -> dict[str, Any]:
        return {"num_gpu_blocks": self.num_gpu_blocks, "block_size": self.block_size, "tokens": self.tokens}


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:  # "None": a CPU engine's num_cpu_blocks, or a size not known yet
        return None


def kv_blocks(text: str | bytes) -> KvBlocks | None:
    """The smallest engine core's KV cache from a `/metrics` page, None when no series states
    `num_gpu_blocks` (an engine that does not expose `vllm:cache_config_info`)."""
    found: KvBlocks | None = None
    for sample in samples(text, names={CACHE_CONFIG_INFO}):
        try:
            labels = sample.labels
        except ValueError:
            continue
        blocks = _int(labels.get("num_gpu_blocks"))
        if blocks is None or blocks < 0:
            continue
        if found is None or blocks < found.num_gpu_blocks:
            found = KvBlocks(blocks, _int(labels.get("block_size")))
    return found
