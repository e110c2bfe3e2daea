"""Automatic prefix caching as vLLM does it: a hash chain over full blocks of prompt tokens, LRU eviction.

Only full blocks are cached; the last prompt token is always recomputed, so a prompt fully in the cache
hits at most `num_tokens - 1` tokens rounded down to whole blocks. Queries and hits are counted in tokens,
matching `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total`. A reset (sleep level >= 1,
`POST /reset_prefix_cache`) drops every block at once and is counted, so a reader that saw the count move
past a figure taken earlier knows no block from before it remains (vLLM has no such figure).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


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

    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
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

    def insert(self, hashes: Sequence[int], limit_blocks: int | None = None) -> None:
        """Remember computed blocks; evict least recently used ones beyond `limit_blocks` (or capacity)."""
        blocks = self._blocks
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        limit = (
            self.capacity_blocks if limit_blocks is None else max(0, min(limit_blocks, self.capacity_blocks))
        )
        while len(blocks) > limit:
            blocks.popitem(last=False)

    def reset(self) -> None:
        """Drop every cached block (vLLM's `reset_prefix_cache`); the next lookup of any prefix misses."""
        self._blocks.clear()
        self.resets += 1
