"""An engine's KV events are untrusted input (issue 27, finding 4): each hostile shape a compromised
engine sent is refused by the decoder or the bounds before it reaches the index, the index keeps its
memory bounded in bytes and gives it back when an engine is cleared or forgotten, and a failing index
never fails a pick."""

from __future__ import annotations

import sys
from typing import Any

import msgspec
import pytest

from corral.engine.kv_event_bounds import MAX_HASH_BYTES, BadKvEvents, check_batch
from corral.engine.kv_events import (
    AllBlocksCleared,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from corral.router.discovery.kv_events_feed import apply_batch
from corral.router.routing import kv_index
from corral.router.routing.kv_holders import KvPrefixHolders
from corral.router.routing.kv_index import KvIndex, content_chain
from corral.router.routing.prompt_tokens import SimPromptTokens
from corral.router.routing.request import RouteRequest
from corral.router.telemetry.engine_input import EngineInputRefusals

URL = "http://127.0.0.1:9001"


def _stored(**over: Any) -> BlockStored:
    fields: dict[str, Any] = {
        "block_hashes": [1, 2],
        "parent_block_hash": None,
        "token_ids": list(range(32)),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None, None],
    }
    fields.update(over)
    return BlockStored(**fields)


def _batch(*events: Any) -> KVEventBatch:
    return KVEventBatch(ts=1.0, events=list(events), data_parallel_rank=0)


def _raw_payload(event: dict[str, Any]) -> bytes:
    """A batch whose event is written field by field (shapes the typed classes would not build)."""
    return msgspec.msgpack.encode([1.0, [event]])


def _raw_stored(**over: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": list(range(16)),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    event.update(over)
    return event


def test_a_real_batch_passes_the_bounds() -> None:
    batch = _batch(
        _stored(),
        _stored(
            block_hashes=[b"\x01" * 32], parent_block_hash=2, token_ids=list(range(16)), extra_keys=[("a",)]
        ),
        AllBlocksCleared(),
    )
    check_batch(decode_batch(encode_batch(batch)))


@pytest.mark.parametrize(
    ("event", "match"),
    [
        (_stored(block_size=0, token_ids=[]), "block_size 0"),
        (_stored(block_size=-16), "block_size -16"),
        (_stored(block_size=1 << 40, token_ids=[]), "block_size"),
        (_stored(block_hashes=[b"\x00" * (16 << 10), 2]), f"16384 bytes \\(at most {MAX_HASH_BYTES}\\)"),
        (_stored(parent_block_hash=b"\x00" * 100), "100 bytes"),
        (_stored(token_ids=list(range(33))), "33 token ids for 2 blocks"),
        (_stored(lora_name="x" * 5000), "lora_name of 5000"),
        (_stored(medium="G" * 100), "medium of 100"),
        (_stored(extra_keys=[None, None, None]), "3 extra_keys entries for 2 blocks"),
        (_stored(extra_keys=[(((((("deep",),),),),),), None]), "nested deeper"),
        (_stored(extra_keys=[tuple(range(100)), None]), "over 64 items"),
        (_stored(group_idx=1 << 40), "group_idx"),
    ],
)
def test_each_hostile_field_is_refused_by_the_bounds(event: BlockStored, match: str) -> None:
    batch = decode_batch(encode_batch(_batch(event)))
    with pytest.raises(BadKvEvents, match=match):
        check_batch(batch)


@pytest.mark.parametrize("limit", [None, 20_000])
def test_nesting_past_the_decoders_recursion_is_a_value_error_without_the_payload(limit: int | None) -> None:
    """Also in a process whose recursion limit was raised (a library may): msgspec's decoder would then
    nest as deep as the limit lets it, and past the C stack's depth crash the process."""
    payload = b"".join(_deep_array(5000)) + b"\xa1x"  # [[[...["x"]...]]] written without recursion
    event = _raw_payload(_raw_stored(extra_keys=[["PLACEHOLDER"]]))
    payload = event.replace(msgspec.msgpack.encode("PLACEHOLDER"), payload)
    saved = sys.getrecursionlimit()
    if limit is not None:
        sys.setrecursionlimit(limit)
    try:
        with pytest.raises(ValueError, match="nested too deep") as info:
            decode_batch(payload)
        assert sys.getrecursionlimit() == (limit or saved)  # given back as it was
    finally:
        sys.setrecursionlimit(saved)
    assert "9191" not in str(info.value)  # no payload bytes in the message


def _deep_array(depth: int) -> list[bytes]:
    return [b"\x91"] * depth  # fixarray of one element


@pytest.mark.parametrize(
    "payload",
    [
        _raw_payload(_raw_stored(block_size=2**64 - 1)),  # fits msgpack, not the router's sizes
        _raw_payload(_raw_stored(token_ids="not a list")),
        b"\xc1",  # never used in msgpack
        b"\xdd\xff\xff\xff\xff",  # an array claiming 4G items
    ],
)
def test_undecodable_or_out_of_bounds_payloads_never_raise_anything_but_value_error(payload: bytes) -> None:
    try:
        check_batch(decode_batch(payload))
    except ValueError:
        return
    raise AssertionError("accepted")


def test_a_zero_block_size_reaching_the_index_is_ignored_not_a_division_by_zero() -> None:
    index = KvIndex()
    assert index.stored(URL, [1], None, [], 0) == 0
    assert index.block_size(URL) is None
    assert content_chain(list(range(32)), 16) == index.chain(list(range(32)), 16)


def test_a_block_size_changed_while_holding_blocks_is_refused() -> None:
    index = KvIndex()
    apply_batch(index, URL, _batch(_stored()))
    with pytest.raises(BadKvEvents, match="block_size 8 after this engine stated 16"):
        apply_batch(index, URL, _batch(_stored(block_hashes=[3], block_size=8, token_ids=list(range(8)))))


def test_digest_hashes_are_kept_as_64_bit_ints_so_each_entry_has_a_bounded_size() -> None:
    index = KvIndex()
    digest = bytes(range(32))
    index.stored(URL, [digest], None, list(range(16)), 16)
    [(kept, _)] = index._engines[URL].blocks.items()
    assert kept == int.from_bytes(digest, "big") & (2**64 - 1)
    assert index.removed(URL, [digest]) == 1


def test_lora_names_are_held_per_engine_bounded_and_released_when_it_is_cleared_or_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kv_index, "MAX_LORAS_PER_ENGINE", 50)
    index = KvIndex()
    for n in range(200):
        index.stored(URL, [n], None, list(range(16)), 16, lora_name=f"adapter-{n}")
    assert len(index._lora_roots) == 50
    assert index.to_json(URL)["unindexed"] == 150  # type: ignore[index]
    index.stored("http://other", [1], None, list(range(16)), 16, lora_name="adapter-0")
    assert index.root_of_model("adapter-0") != kv_index.BASE_ROOT
    index.cleared(URL)
    assert set(index._lora_roots) == {"adapter-0"}  # the other engine still holds blocks under it
    index.forget("http://other")
    assert index._lora_roots == {}
    assert index.root_of_model("adapter-0") == kv_index.BASE_ROOT


def test_lora_names_without_blocks_are_not_kept() -> None:
    index = KvIndex()
    for n in range(1000):  # fewer tokens than a block: nothing stored, as the attack sent
        index.stored(URL, [n], None, [1, 2], 16, lora_name=f"adapter-{n}")
    assert len(index._lora_roots) <= kv_index.MAX_LORAS_PER_ENGINE
    index.forget(URL)
    assert index._lora_roots == {}


def test_forgetting_an_engine_rebuilds_the_holders_table() -> None:
    index = KvIndex()
    index.stored(URL, list(range(10_000)), None, list(range(10_000 * 4)), 4)
    big = index._holders
    index.forget(URL)
    assert index._holders is not big and index._holders == {}


class _BrokenIndex(KvIndex):
    def longest(self, keys: Any, now: float | None = None) -> dict[str, int]:
        raise ZeroDivisionError("range() arg 3 must not be zero")


class _Memory:
    def held(self, request: RouteRequest, pool: Any) -> list[float]:
        return [0.5] * len(pool)

    def holders(self, request: RouteRequest) -> Any:
        yield "http://memory"

    def sent(self, request: RouteRequest, endpoint: Any) -> None:
        pass

    def placed(self, endpoint: Any) -> int:
        return 0


def test_an_index_that_raises_makes_the_pick_ask_the_prefix_memory_counted() -> None:
    from corral.engine_state import EngineState
    from corral.router.membership.endpoint import Endpoint

    index = _BrokenIndex()
    index.stored(URL, [1], None, list(range(16)), 16)
    refusals = EngineInputRefusals()
    holders = KvPrefixHolders(index, SimPromptTokens(), lambda url: True, _Memory(), refusals)
    pool = [Endpoint(URL, frozenset({"m"}), EngineState.READY)]
    request = RouteRequest(model="m", headers={}, payload={"prompt": "the sea " * 40})
    assert holders.held(request, pool) == [0.5]
    assert list(holders.holders(request)) == ["http://memory"]
    assert refusals.kv_fallbacks == 2
