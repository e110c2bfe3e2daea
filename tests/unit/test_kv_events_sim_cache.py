"""The simulator's prefix cache as vLLM's KV events: which blocks a BlockStored names, with which parent,
tokens and LoRA keys; one BlockRemoved per eviction; AllBlocksCleared on reset; batching by `take`."""

from __future__ import annotations

from corral.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, block_hashes
from corral.sim.core.cache_events import CachedLora, CacheEvents
from corral.sim.core.prefix_cache import PrefixCache

TOKENS = list(range(100, 100 + 4 * 4 + 2))  # four full blocks of 4 and two tokens


def _cache(capacity: int = 100) -> tuple[PrefixCache, CacheEvents]:
    events = CacheEvents(4, seed="0")
    return PrefixCache(4, capacity, events), events


def test_stored_blocks_carry_vllms_hashes_and_their_tokens() -> None:
    cache, events = _cache()
    hashes = cache.hashes(TOKENS)
    assert hashes == block_hashes(TOKENS, 4, seed="0")
    cache.insert(hashes, token_ids=TOKENS)
    (stored,) = events.take()
    assert stored == BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=TOKENS[:16],
        block_size=4,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=[None] * 4,
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )
    cache.insert(hashes, token_ids=TOKENS)
    assert events.take() == []  # nothing new: no event


def test_only_new_blocks_are_stored_one_event_per_run_with_its_parent() -> None:
    cache, events = _cache()
    hashes = cache.hashes(TOKENS)
    cache.insert([hashes[2]], token_ids=TOKENS)
    events.take()
    cache.insert(hashes, token_ids=TOKENS)
    before, after = events.take()
    assert isinstance(before, BlockStored) and isinstance(after, BlockStored)
    assert (before.block_hashes, before.parent_block_hash, before.token_ids) == (hashes[:2], None, TOKENS[:8])
    assert (after.block_hashes, after.parent_block_hash, after.token_ids) == (
        [hashes[3]],
        hashes[2],
        TOKENS[12:16],
    )


def test_evictions_and_resets() -> None:
    cache, events = _cache(capacity=3)
    hashes = cache.hashes(TOKENS)
    cache.insert(hashes, token_ids=TOKENS)
    stored, removed = events.take()
    assert isinstance(stored, BlockStored) and len(stored.block_hashes) == 4
    assert removed == BlockRemoved(block_hashes=[hashes[0]], medium="GPU", group_idx=0)
    cache.reset()
    assert events.take() == [AllBlocksCleared()]


def test_lora_blocks_are_keyed_by_the_adapter_and_name_it() -> None:
    cache, events = _cache()
    lora = CachedLora("sql", "/adapters/sql", 7)
    hashes = cache.hashes(TOKENS, lora)
    assert hashes != cache.hashes(TOKENS)
    assert hashes == block_hashes(TOKENS, 4, seed="0", extra_keys=[(("lora", "sql", "/adapters/sql"),)] * 4)
    cache.insert(hashes, token_ids=TOKENS, lora=lora)
    (stored,) = events.take()
    assert isinstance(stored, BlockStored)
    assert (stored.lora_id, stored.lora_name, stored.extra_keys) == (7, "sql", [("sql",)] * 4)


def test_the_first_event_of_a_batch_tells_the_publisher() -> None:
    cache, events = _cache(capacity=1)
    calls: list[int] = []
    events.on_pending = lambda: calls.append(1)
    hashes = cache.hashes(TOKENS)
    cache.insert(hashes, token_ids=TOKENS)  # a store and three removals: one call
    assert len(calls) == 1 and len(events.take()) == 4
    cache.reset()
    assert len(calls) == 2


def test_without_events_the_cache_keeps_its_own_hashes() -> None:
    cache = PrefixCache(4, 10)
    assert cache.hashes(TOKENS) != block_hashes(TOKENS, 4, seed="0")
    assert len(cache.hashes(TOKENS)) == 4
