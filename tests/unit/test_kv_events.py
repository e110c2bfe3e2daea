"""vLLM's KV-event encoding, framing, config and block hashing against golden files vLLM's own code made."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from corral.engine import kv_events
from corral.engine.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    block_hash_digests,
    block_hashes,
    decode_batch,
    encode_batch,
    external_hash,
    none_hash,
    parse_kv_events_config,
    parse_published,
    parse_seq,
)

GOLDEN = Path(__file__).parents[1] / "data" / "kv_events"


def _golden(name: str) -> bytes:
    return (GOLDEN / name).read_bytes()


def test_hand_built_batch_has_vllms_bytes() -> None:
    batch = KVEventBatch(
        ts=1764800000.25,
        events=[
            BlockStored(
                block_hashes=[1, 2**64 - 1],
                parent_block_hash=None,
                token_ids=list(range(32)),
                block_size=16,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                group_idx=0,
            ),
            BlockStored(
                block_hashes=[12345678901234567890],
                parent_block_hash=2**64 - 1,
                token_ids=list(range(32, 48)),
                block_size=16,
                lora_id=3,
                medium="GPU",
                lora_name="sql-lora",
                extra_keys=[("sql-lora", "salt")],
                group_idx=0,
                session_id="s-1",
            ),
            BlockRemoved(block_hashes=[1, 2**64 - 1], medium="GPU", group_idx=0),
            AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )
    assert encode_batch(batch) == _golden("batch_int.msgpack")


def test_bytes_hashes_have_vllms_bytes() -> None:
    batch = KVEventBatch(
        ts=2.5,
        events=[
            BlockStored(
                block_hashes=[b"\x01" * 32],
                parent_block_hash=b"\x02" * 32,
                token_ids=[5, 6],
                block_size=2,
                lora_id=None,
                medium="CPU",
                lora_name=None,
            ),
            BlockRemoved(block_hashes=[b"\x01" * 32], medium=None),
        ],
    )
    assert encode_batch(batch) == _golden("batch_bytes.msgpack")


@pytest.mark.parametrize("name", ["batch_int.msgpack", "batch_bytes.msgpack"])
def test_vllm_payloads_decode_and_encode_back_unchanged(name: str) -> None:
    payload = _golden(name)
    batch = decode_batch(payload)
    assert encode_batch(batch) == payload


def test_decoded_fields_are_vllms() -> None:
    batch = decode_batch(_golden("batch_int.msgpack"))
    stored, with_lora, removed, cleared = batch.events
    assert isinstance(stored, BlockStored) and stored.block_hashes == [1, 2**64 - 1]
    assert stored.parent_block_hash is None and stored.block_size == 16 and stored.medium == "GPU"
    assert isinstance(with_lora, BlockStored)
    assert (with_lora.lora_id, with_lora.lora_name, with_lora.session_id) == (3, "sql-lora", "s-1")
    assert with_lora.extra_keys == [("sql-lora", "salt")]
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == [1, 2**64 - 1]
    assert isinstance(cleared, AllBlocksCleared)
    assert batch.data_parallel_rank == 0 and batch.ts == 1764800000.25


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"garbage",
        b"\x93\xcb",
        bytes.fromhex("93cb3ff8000000000000910100"),
        bytes.fromhex("81a474797065a3426164"),
    ],
)
def test_garbage_is_a_value_error_naming_the_payload(payload: bytes) -> None:
    expected = rf"KV event payload of {len(payload)} bytes .* not a vLLM event batch"
    with pytest.raises(ValueError, match=expected):
        decode_batch(payload)


def test_unknown_event_type_is_rejected() -> None:
    payload = bytes.fromhex("93cb3ff80000000000009181a474797065a64e6f53756368") + b"\x00"
    with pytest.raises(ValueError, match="not a vLLM event batch"):
        decode_batch(payload)


def test_published_and_replayed_frames_parse_as_vllm_sends_them() -> None:
    frames = json.loads((GOLDEN / "zmq_frames.json").read_text())
    published = [[bytes.fromhex(f) for f in m] for m in frames["published"]]
    for seq, message in enumerate(published):
        topic, got_seq, payload = parse_published(message)
        assert (topic, got_seq) == (b"kv@engine-a", seq)
        assert encode_batch(decode_batch(payload)) == payload
    replayed = [[bytes.fromhex(f) for f in m] for m in frames["replayed"]]
    assert [bytes.fromhex(f) for f in frames["replay_request"]] == [b"", kv_events.seq_frame(1)]
    assert all(m[0] == b"" for m in replayed)
    assert [parse_published(m[1:])[1] for m in replayed] == [1, -1]
    assert replayed[-1][1:] == [b"", kv_events.REPLAY_END_SEQ, b""]
    assert replayed[0][1:] == published[1]


def test_seq_frames() -> None:
    assert kv_events.seq_frame(258) == b"\x00" * 6 + b"\x01\x02"
    assert parse_seq(kv_events.seq_frame(2**63)) == 2**63
    assert parse_seq(kv_events.REPLAY_END_SEQ) == -1
    with pytest.raises(ValueError, match="is 3 bytes, not 8"):
        parse_seq(b"abc")
    with pytest.raises(ValueError, match="has 2 frames"):
        parse_published([b"", b""])


def _hash_cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads((GOLDEN / "block_hashes.json").read_text())["cases"]
    return cases


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _case_id(case: dict[str, Any]) -> str:
    return f"{case['algo']}-seed{case['seed']}-extra{bool(case['extra_keys'])}"


@pytest.mark.parametrize("case", _hash_cases(), ids=_case_id)
def test_block_hashes_equal_vllms(case: dict[str, Any]) -> None:
    golden = json.loads((GOLDEN / "block_hashes.json").read_text())
    extra = [_tuples(k) for k in case["extra_keys"]] if case["extra_keys"] else None
    kwargs: dict[str, Any] = {"algo": case["algo"], "seed": case["seed"], "extra_keys": extra}
    assert none_hash(case["algo"], case["seed"]).hex() == case["none_hash"]
    digests = block_hash_digests(golden["token_ids"], golden["block_size"], **kwargs)
    assert [d.hex() for d in digests] == case["digests"]
    assert block_hashes(golden["token_ids"], golden["block_size"], **kwargs) == case["event_hashes"]
    assert [external_hash(d) for d in digests] == case["event_hashes"]


def test_block_hashes_cover_full_blocks_only_and_chain() -> None:
    tokens = list(range(40))
    assert len(block_hashes(tokens, 16)) == 2
    assert block_hashes(tokens[:32], 16) == block_hashes(tokens, 16)
    assert block_hashes(tokens[:15], 16) == []
    changed = [99, *tokens[1:]]
    assert block_hashes(changed, 16)[1] != block_hashes(tokens, 16)[1]


def test_hashing_errors_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="'md5' is unknown; vLLM has sha256"):
        block_hashes([1], 1, algo="md5")
    with pytest.raises(ValueError, match="pass the engine's PYTHONHASHSEED"):
        none_hash("xxhash")
    with pytest.raises(ValueError, match="block size 0"):
        block_hashes([1], 0)


def test_external_hash_keeps_ints_and_cuts_digests_to_64_bits() -> None:
    assert external_hash(7) == 7
    assert external_hash(b"\xff" * 24 + b"\x00" * 7 + b"\x05") == 5


def test_config_as_vllm_takes_it() -> None:
    config = parse_kv_events_config(
        '{"enable_kv_cache_events": true, "endpoint": "tcp://*:6001", "replay_endpoint": "tcp://*:6002", '
        '"buffer_steps": 50, "topic": "kv"}'
    )
    assert config.publishing and config.publisher == "zmq"
    assert (config.endpoint, config.replay_endpoint, config.buffer_steps, config.topic) == (
        "tcp://*:6001",
        "tcp://*:6002",
        50,
        "kv",
    )
    assert (config.hwm, config.max_queue_size) == (100_000, 100_000)
    off = parse_kv_events_config("{}")
    assert off.publisher == "null" and not off.publishing and off.endpoint == "tcp://*:5557"
    assert not parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "null"}').publishing


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "is not JSON"),
        ("[]", "is a JSON list, not an object"),
        ('{"enable_kv_cache_event": true}', "unknown field 'enable_kv_cache_event'"),
        ('{"enable_kv_cache_events": "yes"}', "'enable_kv_cache_events' is 'yes'; it takes bool"),
        ('{"buffer_steps": true}', "'buffer_steps' is True; it takes int"),
        ('{"hwm": -1}', "'hwm' is -1; it takes a count >= 0"),
        ('{"publisher": "kafka"}', "publisher 'kafka' is unknown"),
        ('{"endpoint": "localhost:5557"}', "endpoint 'localhost:5557' is not a ZMQ address"),
    ],
)
def test_config_errors_name_the_field(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        parse_kv_events_config(text)
