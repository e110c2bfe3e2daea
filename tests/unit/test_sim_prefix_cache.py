"""Prefix cache: block hash chain, vLLM's token-based hit counting, LRU eviction."""

from __future__ import annotations

from corral.sim.core.prefix_cache import PrefixCache, block_hashes


def test_only_full_blocks_are_hashed_and_hashes_chain() -> None:
    assert len(block_hashes(list(range(47)), 16)) == 2
    a = block_hashes([1] * 16 + [2] * 16, 16)
    b = block_hashes([3] * 16 + [2] * 16, 16)
    assert a[1] != b[1]  # same second block, different prefix


def test_queries_and_hits_are_counted_in_tokens() -> None:
    cache = PrefixCache(block_size=16, capacity_blocks=100)
    prompt = list(range(100))
    hashes = block_hashes(prompt, 16)
    assert cache.lookup(hashes, len(prompt)) == 0
    cache.insert(hashes)
    assert cache.lookup(hashes, len(prompt)) == 96
    assert (cache.queries, cache.hits) == (200, 96)


def test_last_token_is_always_recomputed() -> None:
    cache = PrefixCache(block_size=16, capacity_blocks=100)
    prompt = list(range(64))  # exactly 4 blocks
    hashes = block_hashes(prompt, 16)
    cache.insert(hashes)
    assert cache.lookup(hashes, len(prompt)) == 48


def test_hits_stop_at_first_missing_block() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=100)
    shared = [7, 7, 7, 7]
    cache.insert(block_hashes([*shared, 1, 1, 1, 1, 9], 4))
    assert cache.lookup(block_hashes([*shared, 2, 2, 2, 2, 9], 4), 9) == 4


def test_least_recently_used_blocks_are_evicted() -> None:
    cache = PrefixCache(block_size=2, capacity_blocks=2)
    a, b, c = (block_hashes([x, x, 0], 2) for x in (1, 2, 3))
    cache.insert(a)
    cache.insert(b)
    cache.lookup(a, 3)  # a becomes most recent
    cache.insert(c)  # evicts b
    assert len(cache) == 2
    assert cache.lookup(a, 3) == 2
    assert cache.lookup(b, 3) == 0
    assert cache.lookup(c, 3) == 2


def test_a_reset_drops_every_block_and_is_counted() -> None:
    cache = PrefixCache(block_size=2, capacity_blocks=10)
    hashes = block_hashes([1, 1, 2, 2, 0], 2)
    cache.insert(hashes)
    assert (len(cache), cache.resets) == (2, 0)
    cache.reset()
    assert (len(cache), cache.resets) == (0, 1)
    assert cache.lookup(hashes, 5) == 0
