"""The router's KV-event index: blocks keyed by a content chain the router computes itself, whatever
the engines' own hashes; store, remove, clear, leave, the caps, and the longest held prefix."""

from __future__ import annotations

import pytest

from corral.engine.kv_events import block_hashes
from corral.router.routing.kv_index import KvIndex, content_chain, lora_root

BS = 4
A, B, C = "http://a:8000", "http://b:8000", "http://c:8000"


def _tokens(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BS))


def _store(index: KvIndex, url: str, tokens: list[int], *, seed: str = "s", first: int = 0) -> list[int]:
    """Store blocks `first`.. of `tokens` on `url` as vLLM would report them (its own hashes, seeded)."""
    hashes = block_hashes(tokens, BS, seed=seed)
    parent = hashes[first - 1] if first else None
    index.stored(url, hashes[first:], parent, tokens[first * BS : len(hashes) * BS], BS)
    return hashes


def test_engines_with_different_hash_seeds_share_one_key_space() -> None:
    index = KvIndex()
    tokens = _tokens(6)
    _store(index, A, tokens, seed="one")
    _store(index, B, tokens[: 3 * BS], seed="two")  # other seed: other engine hashes, same content
    chain = content_chain(tokens, BS)
    assert index.longest(chain) == {A: 6, B: 3}
    assert index.distinct_blocks == 6
    assert index.blocks == 9


def test_a_store_continuing_an_earlier_block_chains_from_its_parent() -> None:
    index = KvIndex()
    tokens = _tokens(5)
    hashes = block_hashes(tokens, BS, seed="s")
    index.stored(A, hashes[:2], None, tokens[: 2 * BS], BS)
    index.stored(A, hashes[2:], hashes[1], tokens[2 * BS :], BS)
    assert index.longest(content_chain(tokens, BS)) == {A: 5}


def test_a_store_whose_parent_is_unknown_is_not_indexed() -> None:
    index = KvIndex()
    tokens = _tokens(4)
    _store(index, A, tokens, first=2)  # the parent block was never reported
    assert index.longest(content_chain(tokens, BS)) == {}
    assert index.to_json(A)["orphans"] == 2  # type: ignore[index]


def test_the_longest_run_stops_at_the_first_block_an_engine_lacks() -> None:
    index = KvIndex()
    tokens = _tokens(6)
    hashes = _store(index, A, tokens)
    index.removed(A, [hashes[2]])  # a hole in the middle: blocks 3.. no longer count
    _store(index, B, _tokens(6, start=1000))  # another prompt entirely
    assert index.longest(content_chain(tokens, BS)) == {A: 2}


def test_removed_and_cleared_forget_blocks() -> None:
    index = KvIndex()
    tokens = _tokens(3)
    hashes = _store(index, A, tokens)
    _store(index, B, tokens)
    assert index.removed(A, hashes) == 3
    assert index.removed(A, hashes) == 0  # twice: nothing more
    assert index.longest(content_chain(tokens, BS)) == {B: 3}
    index.cleared(B)
    assert index.longest(content_chain(tokens, BS)) == {}
    assert index.blocks == 0 and index.distinct_blocks == 0
    assert index.indexes(B)  # still followed, holding nothing


def test_a_leaving_engine_is_forgotten_and_its_slot_reused() -> None:
    index = KvIndex()
    tokens = _tokens(3)
    _store(index, A, tokens)
    _store(index, B, tokens)
    index.forget(A)
    assert not index.indexes(A)
    _store(index, C, tokens[: 2 * BS])  # takes A's slot: must not inherit A's blocks
    assert index.longest(content_chain(tokens, BS)) == {B: 3, C: 2}


def test_per_engine_cap_drops_the_oldest_blocks_first() -> None:
    index = KvIndex(blocks_per_engine=8)
    old, new = _tokens(6), _tokens(6, start=500)
    _store(index, A, old)
    _store(index, A, new)
    assert index.to_json(A)["blocks"] <= 8  # type: ignore[index]
    assert index.longest(content_chain(new, BS)) == {A: 6}
    assert index.longest(content_chain(old, BS)).get(A, 0) < 6
    assert index.blocks == index.to_json(A)["blocks"]  # type: ignore[index]


def test_total_cap_bounds_all_engines_together() -> None:
    index = KvIndex(blocks_per_engine=100, total_blocks=10)
    for i, url in enumerate((A, B, C)):
        _store(index, url, _tokens(6, start=100 * i))
    assert index.blocks <= 10
    assert index.longest(content_chain(_tokens(6, start=200), BS)) == {C: 6}  # the newest kept whole


def test_lora_blocks_have_their_own_chain() -> None:
    index = KvIndex()
    tokens = _tokens(2)
    hashes = block_hashes(tokens, BS, seed="s")
    index.stored(A, hashes, None, tokens, BS, lora_name="sql-adapter")
    assert index.longest(content_chain(tokens, BS)) == {}
    root = index.root_of_model("sql-adapter")
    assert root == lora_root("sql-adapter")
    assert index.longest(content_chain(tokens, BS, root)) == {A: 2}


def test_a_pending_hold_counts_until_it_lapses() -> None:
    index = KvIndex(pending_seconds=5.0)
    index.watch(A)
    chain = content_chain(_tokens(3), BS)
    index.sent(A, chain, now=100.0)
    assert index.longest(chain, now=101.0) == {A: 3}
    assert index.longest(chain, now=106.0) == {}


def test_bad_caps_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        KvIndex(blocks_per_engine=0)


def test_many_holders_then_one_left() -> None:
    index = KvIndex()
    tokens = _tokens(2)
    urls = [f"http://e{i}:8000" for i in range(70)]
    stored = {url: _store(index, url, tokens) for url in urls}
    assert index.longest(content_chain(tokens, BS)) == dict.fromkeys(urls, 2)
    for url in urls[:-1]:
        index.removed(url, stored[url])
    assert index.longest(content_chain(tokens, BS)) == {urls[-1]: 2}
    index.removed(urls[-1], stored[urls[-1]][1:])
    assert index.longest(content_chain(tokens, BS)) == {urls[-1]: 1}
    assert index.distinct_blocks == 1
