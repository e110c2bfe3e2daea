"""What a router accepts from an engine's KV-cache events: the bounds on every field it computes with or
keeps, checked on a decoded batch before any of it reaches the index. An engine is untrusted input: a
batch outside these bounds is refused whole (`BadKvEvents`), and the feed treats its engine's events as
bad, not the router's routing.

Every bound is far above what vLLM 0.32 sends (docs/kv-events-conformance.md): block sizes of 1-256
(a hybrid model's aligned size can be a few thousand), hashes of 8 bytes (an int) or 16-32 bytes (an
xxh3-128 or sha256 digest), `extra_keys` one tuple of scalars per block, media "GPU", "CPU", "STORAGE".
"""

from __future__ import annotations

from typing import Any

from corral.engine.kv_events import BlockRemoved, BlockStored, KVEventBatch

# One published message (ZMQ MAXMSGSIZE on the SUB and replay sockets). A scheduler step caches at most
# max_num_batched_tokens tokens (8k-64k in practice): ~5 bytes a token id, ~9 a hash, so 64k tokens are
# ~0.4 MB; 8 MiB is 20x that, and what it decodes to (lists of ints) stays under ~70 MB per message.
MAX_MESSAGE_BYTES = 8 << 20
# Tokens per block: vLLM's sizes are 1-256; a hybrid (Mamba) model aligns to a few thousand.
MAX_BLOCK_SIZE = 16_384
# A hash as bytes: sha256 (32) or xxh3-128 (16) digests; room for a 512-bit one.
MAX_HASH_BYTES = 64
# An int hash is the digest's low 64 bits; msgpack carries -2**63 .. 2**64 - 1, all accepted.
# Adapter names, media and the other labels an event carries.
MAX_NAME_CHARS = 1024
MAX_LABEL_CHARS = 64
# extra_keys: one entry per block, each a tuple of scalars (or of small tuples): nesting beyond this
# depth is not vLLM's and is refused before anything walks it recursively.
MAX_EXTRA_KEYS_DEPTH = 4
MAX_EXTRA_KEYS_ITEMS = 64  # items in one block's tuple, at any depth
# a string in them: an adapter's name, a multimodal hash (64 hex), a request's cache salt
MAX_EXTRA_KEY_CHARS = 8192
MAX_GROUP_INDEX = 1024
MAX_DATA_PARALLEL_RANK = 65_536


class BadKvEvents(ValueError):
    """A batch outside the bounds: what is wrong, never the payload's bytes."""


def check_batch(batch: KVEventBatch) -> None:
    """Raise BadKvEvents naming the first field of `batch` outside the bounds."""
    rank = batch.data_parallel_rank
    if rank is not None and not 0 <= rank <= MAX_DATA_PARALLEL_RANK:
        raise BadKvEvents(f"data_parallel_rank {rank} is outside 0..{MAX_DATA_PARALLEL_RANK}")
    for n, event in enumerate(batch.events):
        if isinstance(event, BlockStored):
            _check_stored(n, event)
        elif isinstance(event, BlockRemoved):
            _check_hashes(n, event.block_hashes)
            _check_label(n, "medium", event.medium, MAX_LABEL_CHARS)
            _check_group(n, event.group_idx)


def _check_stored(n: int, event: BlockStored) -> None:
    size = event.block_size
    if not 1 <= size <= MAX_BLOCK_SIZE:
        raise BadKvEvents(f"event {n}: block_size {size} is outside 1..{MAX_BLOCK_SIZE}")
    blocks = len(event.block_hashes)
    if len(event.token_ids) > blocks * size:
        raise BadKvEvents(
            f"event {n}: {len(event.token_ids)} token ids for {blocks} blocks of {size} "
            f"(at most {blocks * size})"
        )
    _check_hashes(n, event.block_hashes)
    if event.parent_block_hash is not None:
        _check_hashes(n, (event.parent_block_hash,))
    _check_label(n, "lora_name", event.lora_name, MAX_NAME_CHARS)
    _check_label(n, "medium", event.medium, MAX_LABEL_CHARS)
    for name in ("kv_cache_spec_kind", "locality", "ownership", "session_id"):
        _check_label(n, name, getattr(event, name), MAX_NAME_CHARS)
    _check_group(n, event.group_idx)
    extra = event.extra_keys
    if extra is not None:
        if len(extra) > blocks:
            raise BadKvEvents(f"event {n}: {len(extra)} extra_keys entries for {blocks} blocks")
        for keys in extra:
            if keys is not None:
                _check_nested(n, keys)


def _check_hashes(n: int, hashes: Any) -> None:
    for h in hashes:
        if isinstance(h, bytes) and len(h) > MAX_HASH_BYTES:
            raise BadKvEvents(f"event {n}: a block hash of {len(h)} bytes (at most {MAX_HASH_BYTES})")


def _check_label(n: int, name: str, value: str | None, limit: int) -> None:
    if value is not None and len(value) > limit:
        raise BadKvEvents(f"event {n}: {name} of {len(value)} characters (at most {limit})")


def _check_group(n: int, group: int | None) -> None:
    if group is not None and not 0 <= group <= MAX_GROUP_INDEX:
        raise BadKvEvents(f"event {n}: group_idx {group} is outside 0..{MAX_GROUP_INDEX}")


def _check_nested(n: int, keys: Any) -> None:
    """One block's extra keys: depth and item count bounded, walked without recursion."""
    stack: list[tuple[Any, int]] = [(keys, 1)]
    items = 0
    while stack:
        value, depth = stack.pop()
        if isinstance(value, list | tuple | dict):
            if depth > MAX_EXTRA_KEYS_DEPTH:
                raise BadKvEvents(f"event {n}: extra_keys nested deeper than {MAX_EXTRA_KEYS_DEPTH}")
            items += len(value)
            if items > MAX_EXTRA_KEYS_ITEMS:
                raise BadKvEvents(f"event {n}: a block's extra_keys hold over {MAX_EXTRA_KEYS_ITEMS} items")
            inner = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in inner)
        elif isinstance(value, str | bytes) and len(value) > MAX_EXTRA_KEY_CHARS:
            raise BadKvEvents(
                f"event {n}: an extra key of {len(value)} characters (at most {MAX_EXTRA_KEY_CHARS})"
            )
