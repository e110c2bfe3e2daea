"""Automatic prefix caching as vLLM does it: a hash chain over full blocks of prompt tokens, LRU eviction.

Only full blocks are cached; the last prompt token is always recomputed, so a prompt fully in the cache
hits at most `num_tokens - 1` tokens rounded down to whole blocks. Queries and hits are counted in tokens,
matching `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total`. A reset (sleep level >= 1,
`POST /reset_prefix_cache`) drops every block at once and is counted, so a reader that saw the count move
past a figure taken earlier knows no block from before it remains (vLLM has no such figure). With
`events` (`--kv-events-config`) the keys are vLLM's block hashes and every change becomes a KV event.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from corral.sim.core.cache_events import CachedLora, CacheEvents


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """One hash per full block; each hash covers its parent's, so equal hashes mean equal prefixes."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


class PrefixCache:
    """Cached blocks by hash, least recently used first; capacity in blocks."""

    def __init__(self, block_size: int, capacity_blocks: int, events: CacheEvents | None = None) -> None:
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.events = events
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0
        self.hits = 0
        self.resets = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, hashes: Sequence[int], num_tokens: int) -> int:
        """Count a query of `num_tokens` prompt tokens; return how many of them are cached."""
        usable = max(0, (num_tokens - 1) // self.block_size)
        cached_blocks = 0
        blocks = self._blocks
        for h in hashes[:usable]:
            if h not in blocks:
                break
            blocks.move_to_end(h)
            cached_blocks += 1
        cached = cached_blocks * self.block_size
        self.queries += num_tokens
        self.hits += cached
        return cached

    def hashes(self, token_ids: Sequence[int], lora: CachedLora | None = None) -> list[int]:
        """The cache's keys for the full blocks of `token_ids`: vLLM's hashes when it records events."""
        if self.events is not None:
            return self.events.hashes(token_ids, lora)
        return block_hashes(token_ids, self.block_size)

    def insert(
        self,
        hashes: Sequence[int],
        limit_blocks: int | None = None,
        token_ids: Sequence[int] = (),
        lora: CachedLora | None = None,
    ) -> None:
        """Remember computed blocks (of `token_ids`, for the events); evict least recently used ones beyond
        `limit_blocks` (or capacity)."""
        blocks, events = self._blocks, self.events
        new: list[int] = []
        for i, h in enumerate(hashes):
            if events is not None and h not in blocks:
                new.append(i)
            blocks[h] = None
            blocks.move_to_end(h)
        if new and events is not None:
            events.stored(hashes, new, token_ids, lora)
        limit = (
            self.capacity_blocks if limit_blocks is None else max(0, min(limit_blocks, self.capacity_blocks))
        )
        while len(blocks) > limit:
            evicted, _ = blocks.popitem(last=False)
            if events is not None:
                events.removed(evicted)

    def reset(self) -> None:
        """Drop every cached block (vLLM's `reset_prefix_cache`); the next lookup of any prefix misses."""
        self._blocks.clear()
        self.resets += 1
        if self.events is not None:
            self.events.cleared()
