"""vLLM's KV-cache events as every part of Corral shares them: the msgpack encoding of an event batch
(byte-compatible with vLLM's publisher), the ZMQ framing and replay protocol, `--kv-events-config`, and
vLLM's block hashing of token ids (the hashes a BlockStored event carries).

Facts from vLLM 0.32 (distributed/kv_events.py `KVEventBatch`, `ZmqEventPublisher`; config/kv_events.py
`KVEventsConfig`; v1/core/kv_cache_utils.py `hash_block_tokens`, `init_none_hash`,
`maybe_convert_block_hash`; utils/hashing.py); see docs/kv-events-conformance.md.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import pickle
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import msgspec

# A block hash on the wire: the low 64 bits of the digest as an unsigned int (vLLM's default,
# VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1) or the whole digest as bytes (that variable set to 0).
ExternalBlockHash = bytes | int

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


# vLLM's event classes: tagged maps ({"type": "BlockStored", ...}) inside an array-like batch; fields with
# a default are left out when they hold it. Field order and defaults decide the bytes: keep them as vLLM's.
class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """One change to an engine's prefix cache."""


class BlockStored(KVCacheEvent):
    """Full blocks entered the cache; `parent_block_hash` is the block before the first, None at the start."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks left the cache (evicted, or their hash was replaced)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset; no block from before remains."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The events of one scheduler step, as one published message."""

    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    """The payload frame vLLM's publisher sends for `batch`."""
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """A payload frame as vLLM 0.32 publishes it; anything else is a ValueError saying what is wrong
    (never the payload's bytes: an engine's events are untrusted input). Every failure of the decoder is
    that ValueError, nesting too deep for it (a RecursionError) included."""
    try:
        with _nesting_capped():
            return _DECODER.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError, TypeError) as exc:
        why = "nested too deep" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise ValueError(
            f"KV event payload of {len(payload)} bytes is not a vLLM event batch: {why}; "
            "the publisher must be vLLM >= 0.32 (or `corral sim`) with --kv-events-config"
        ) from None


# How deep the decoder may nest below its caller. msgspec's C decoder stops at the interpreter's recursion
# limit (a RecursionError), and only there: a process that raised the limit (a library may) would let a
# hostile payload nest until the C stack overflows. vLLM's events nest a few levels (extra_keys tuples).
DECODE_NESTING = 256


class _nesting_capped:
    """Lowers the recursion limit to the caller's depth + DECODE_NESTING for one synchronous decode."""

    __slots__ = ("_saved",)

    def __init__(self) -> None:
        self._saved = 0

    def __enter__(self) -> None:
        depth, frame = 0, sys._getframe()
        while frame.f_back is not None:
            depth, frame = depth + 1, frame.f_back
        cap = depth + DECODE_NESTING
        self._saved = sys.getrecursionlimit()
        if self._saved > cap:
            sys.setrecursionlimit(cap)

    def __exit__(self, *exc: object) -> None:
        if sys.getrecursionlimit() != self._saved:
            sys.setrecursionlimit(self._saved)


# ZMQ framing. The PUB socket sends (topic, seq, payload): seq counts from 0, 8 bytes big-endian. The
# replay socket is a ROUTER: a DEALER sends (b"", start seq as 8 bytes) and receives (b"", topic, seq,
# payload) for every buffered batch with seq >= start, then (b"", b"", REPLAY_END_SEQ, b"").
SEQ_BYTES = 8
REPLAY_END_SEQ = (-1).to_bytes(SEQ_BYTES, "big", signed=True)


def seq_frame(seq: int) -> bytes:
    """The 8-byte sequence frame of batch `seq`."""
    return seq.to_bytes(SEQ_BYTES, "big")


def parse_seq(frame: bytes) -> int:
    """The sequence number of a seq frame; -1 for the replay end marker."""
    if len(frame) != SEQ_BYTES:
        raise ValueError(
            f"KV event sequence frame {bytes(frame).hex()!r} is {len(frame)} bytes, not {SEQ_BYTES}"
        )
    if frame == REPLAY_END_SEQ:
        return -1
    return int.from_bytes(frame, "big")


def parse_published(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """(topic, seq, payload) of a PUB message, or of a replay message less its leading b"" frame."""
    if len(frames) != 3:
        raise ValueError(
            f"KV event message has {len(frames)} frames; vLLM sends 3 (topic, 8-byte seq, msgpack payload)"
        )
    topic, seq, payload = frames
    return bytes(topic), parse_seq(seq), bytes(payload)


# --kv-events-config, as vLLM's KVEventsConfig takes it.
DEFAULT_ENDPOINT = "tcp://*:5557"
PUBLISHERS = ("null", "zmq")


@dataclass(frozen=True)
class KvEventsConfig:
    """vLLM's `--kv-events-config`; `publisher` resolves to "zmq" when events are on and none is named."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = DEFAULT_ENDPOINT
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @property
    def publishing(self) -> bool:
        """Whether an engine with this config publishes events on ZMQ."""
        return self.enable_kv_cache_events and self.publisher == "zmq"


_CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "enable_kv_cache_events": (bool,),
    "publisher": (str,),
    "endpoint": (str,),
    "replay_endpoint": (str, type(None)),
    "buffer_steps": (int,),
    "hwm": (int,),
    "max_queue_size": (int,),
    "topic": (str,),
}
_EXAMPLE = '\'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}\''


def parse_kv_events_config(text: str) -> KvEventsConfig:
    """`--kv-events-config` as vLLM takes it: a JSON object of KVEventsConfig fields."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"--kv-events-config {text!r} is not JSON ({exc.msg} at position {exc.pos}); write it as vLLM "
            f"takes it, e.g. {_EXAMPLE}"
        ) from None
    if not isinstance(raw, dict):
        raise ValueError(
            f"--kv-events-config {text!r} is a JSON {type(raw).__name__}, not an object; e.g. {_EXAMPLE}"
        )
    known = [f.name for f in fields(KvEventsConfig)]
    for key, value in raw.items():
        if key not in _CONFIG_TYPES:
            raise ValueError(
                f"--kv-events-config has an unknown field {key!r}; vLLM's fields are {', '.join(known)}"
            )
        allowed = _CONFIG_TYPES[key]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise ValueError(f"--kv-events-config field {key!r} is {value!r}; it takes {names}")
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise ValueError(f"--kv-events-config field {key!r} is {value}; it takes a count >= 0")
    enabled = raw.get("enable_kv_cache_events", False)
    publisher = raw.get("publisher") or ("zmq" if enabled else "null")
    if publisher not in PUBLISHERS:
        raise ValueError(
            f"--kv-events-config publisher {publisher!r} is unknown; vLLM has {', '.join(PUBLISHERS)}"
        )
    for key in ("endpoint", "replay_endpoint"):
        endpoint = raw.get(key)
        if endpoint is not None and not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(
                f"--kv-events-config {key} {endpoint!r} is not a ZMQ address; write tcp://*:5557 to bind "
                "or tcp://host:5557 to connect"
            )
    return KvEventsConfig(**{**raw, "publisher": publisher})


# Block hashing. Each full block's hash is hash_fn((parent hash, tuple of the block's token ids, extra
# keys)); the first block's parent is NONE_HASH = hash_fn(seed). The seed is the engine's PYTHONHASHSEED
# when set, else "vllm-none-hash" for the cryptographic algorithms and a random one for xxhash.
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
DEFAULT_HASH_ALGO = "sha256"
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
# pickle.HIGHEST_PROTOCOL on every Python vLLM supports; pinned so the router's Python cannot change it.
PICKLE_PROTOCOL = 5
_EXTERNAL_MASK = (1 << 64) - 1


def _cbor(value: Any, out: bytearray) -> None:
    """Canonical CBOR (RFC 8949) of what a block hash covers, as cbor2.dumps(canonical=True) writes it."""
    if value is None:
        out.append(0xF6)
    elif value is True or value is False:
        out.append(0xF5 if value else 0xF4)
    elif isinstance(value, int):
        major, n = (0, value) if value >= 0 else (1, -1 - value)
        if n > _EXTERNAL_MASK:
            raise ValueError(f"block hash input {value} does not fit CBOR's 64-bit integers")
        _cbor_head(major, n, out)
    elif isinstance(value, bytes):
        _cbor_head(2, len(value), out)
        out += value
    elif isinstance(value, str):
        data = value.encode("utf-8")
        _cbor_head(3, len(data), out)
        out += data
    elif isinstance(value, (tuple, list)):
        _cbor_head(4, len(value), out)
        for item in value:
            if type(item) is int and 0 <= item < 24:  # token ids: the common cases inline
                out.append(item)
            elif type(item) is int and 0 <= item < 65536:
                out += bytes((0x18, item) if item < 256 else (0x19, item >> 8, item & 0xFF))
            else:
                _cbor(item, out)
    else:
        raise ValueError(f"block hash input of type {type(value).__name__} has no CBOR form here")


def _cbor_head(major: int, n: int, out: bytearray) -> None:
    if n < 24:
        out.append(major << 5 | n)
        return
    for extra, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * width):
            out.append(major << 5 | extra)
            out += n.to_bytes(width, "big")
            return


def _xxh3_128(data: bytes) -> bytes:
    try:
        xxhash = importlib.import_module("xxhash")
    except ImportError:
        raise ValueError(
            "prefix caching hash algo xxhash needs the xxhash package: pip install xxhash"
        ) from None
    digest: bytes = xxhash.xxh3_128_digest(data)
    return digest


def _pickled(value: Any) -> bytes:
    return pickle.dumps(value, protocol=PICKLE_PROTOCOL)


def _cbored(value: Any) -> bytes:
    out = bytearray()
    _cbor(value, out)
    return bytes(out)


_HASH_FUNCTIONS: dict[str, Callable[[Any], bytes]] = {
    "sha256": lambda v: hashlib.sha256(_pickled(v)).digest(),
    "sha256_cbor": lambda v: hashlib.sha256(_cbored(v)).digest(),
    "xxhash": lambda v: _xxh3_128(_pickled(v)),
    "xxhash_cbor": lambda v: _xxh3_128(_cbored(v)),
}


def hash_function(algo: str) -> Callable[[Any], bytes]:
    """vLLM's `--prefix-caching-hash-algo` function named `algo`."""
    try:
        return _HASH_FUNCTIONS[algo]
    except KeyError:
        raise ValueError(
            f"prefix caching hash algo {algo!r} is unknown; vLLM has {', '.join(HASH_ALGOS)}"
        ) from None


@functools.lru_cache(maxsize=16)
def none_hash(algo: str = DEFAULT_HASH_ALGO, seed: str | None = None) -> bytes:
    """The parent hash of every first block: the hash of the engine's seed."""
    if seed is None:
        if algo.startswith("xxhash"):
            raise ValueError(
                f"an engine hashing with {algo} seeds its block hashes at random unless PYTHONHASHSEED is "
                "set; pass the engine's PYTHONHASHSEED as seed"
            )
        seed = DEFAULT_NONE_HASH_SEED
    return hash_function(algo)(seed)


def block_hash_digests(
    token_ids: Sequence[int],
    block_size: int,
    *,
    algo: str = DEFAULT_HASH_ALGO,
    seed: str | None = None,
    extra_keys: Sequence[tuple[Any, ...] | None] | None = None,
) -> list[bytes]:
    """vLLM's chained hash digest of every full block of `token_ids`; a partial last block has none.

    `extra_keys[i]` is block i's tuple of tagged keys as vLLM builds them, e.g. (("lora", name, path),) or
    (("cache_salt", salt),) on the first block; missing entries are None (plain text).
    """
    if block_size <= 0:
        raise ValueError(f"block size {block_size} must be a positive number of tokens")
    fn = hash_function(algo)
    parent = none_hash(algo, seed)
    keys = extra_keys or ()
    digests: list[bytes] = []
    for index, start in enumerate(range(0, len(token_ids) - block_size + 1, block_size)):
        extra = keys[index] if index < len(keys) else None
        parent = fn((parent, tuple(token_ids[start : start + block_size]), extra))
        digests.append(parent)
    return digests


def external_hash(block_hash: ExternalBlockHash) -> int:
    """A block hash as an int whichever form the event carried: bytes become their low 64 bits, as vLLM's
    default turns a digest into the event's int."""
    if isinstance(block_hash, int):
        return block_hash
    return int.from_bytes(block_hash, "big") & _EXTERNAL_MASK


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    algo: str = DEFAULT_HASH_ALGO,
    seed: str | None = None,
    extra_keys: Sequence[tuple[Any, ...] | None] | None = None,
) -> list[int]:
    """The hashes vLLM's BlockStored events carry for the full blocks of `token_ids` (the int form)."""
    digests = block_hash_digests(token_ids, block_size, algo=algo, seed=seed, extra_keys=extra_keys)
    return [int.from_bytes(d, "big") & _EXTERNAL_MASK for d in digests]
