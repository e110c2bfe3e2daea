"""The prefix cache's changes as vLLM's KV-cache events (`--kv-events-config`): BlockStored for newly cached
full blocks with vLLM's chained hashes, one BlockRemoved per evicted block, AllBlocksCleared on a reset.

Events wait here until the publisher takes them as one batch (vLLM publishes the events of one scheduler
step together); `on_pending` tells it the first event of a batch arrived.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from corral.engine.kv_events import (
    DEFAULT_HASH_ALGO,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    block_hashes,
)

# The kind of the one KV cache group a plain decoder has (vLLM's KVCacheSpecKind.FULL_ATTENTION).
FULL_ATTENTION = "full_attention"


@dataclass(frozen=True)
class CachedLora:
    """The adapter a request ran with: vLLM keys its blocks apart and names it in BlockStored."""

    name: str
    path: str
    int_id: int


class CacheEvents:
    """Collects BlockStored / BlockRemoved / AllBlocksCleared as the prefix cache changes."""

    def __init__(self, block_size: int, algo: str = DEFAULT_HASH_ALGO, seed: str | None = None) -> None:
        self.block_size = block_size
        self.algo = algo
        self.seed = seed
        self.on_pending: Callable[[], None] = lambda: None
        self._events: list[KVEvent] = []

    def hashes(self, token_ids: Sequence[int], lora: CachedLora | None = None) -> list[int]:
        """vLLM's hashes of the full blocks of a prompt, as its events carry them; the cache's keys."""
        extra: list[tuple[Any, ...] | None] | None = None
        if lora is not None:
            extra = [(("lora", lora.name, lora.path),)] * (len(token_ids) // self.block_size)
        return block_hashes(token_ids, self.block_size, algo=self.algo, seed=self.seed, extra_keys=extra)

    def stored(
        self,
        hashes: Sequence[int],
        new: Sequence[int],
        token_ids: Sequence[int],
        lora: CachedLora | None,
    ) -> None:
        """Blocks `new` (indices into `hashes`, ascending) entered the cache: one event per contiguous run."""
        size = self.block_size
        run_start = 0
        for i, index in enumerate(new):
            last = i + 1 == len(new) or new[i + 1] != index + 1
            if not last:
                continue
            first = new[run_start]
            self._add(
                BlockStored(
                    block_hashes=list(hashes[first : index + 1]),
                    parent_block_hash=hashes[first - 1] if first else None,
                    token_ids=list(token_ids[first * size : (index + 1) * size]),
                    block_size=size,
                    lora_id=lora.int_id if lora else None,
                    medium=MEDIUM_GPU,
                    lora_name=lora.name if lora else None,
                    # vLLM lists each block's keys even when none has any: [None, ...] for plain text.
                    extra_keys=[(lora.name,) if lora else None] * (index + 1 - first),
                    group_idx=0,
                    kv_cache_spec_kind=FULL_ATTENTION,
                )
            )
            run_start = i + 1

    def removed(self, block_hash: int) -> None:
        self._add(BlockRemoved(block_hashes=[block_hash], medium=MEDIUM_GPU, group_idx=0))

    def cleared(self) -> None:
        self._add(AllBlocksCleared())

    def take(self) -> list[KVEvent]:
        """The events since the last take, oldest first."""
        events, self._events = self._events, []
        return events

    def _add(self, event: KVEvent) -> None:
        if not self._events:
            self.on_pending()
        self._events.append(event)
