"""Which engine holds which KV blocks, learnt from the engines' own KV-cache events (BlockStored,
BlockRemoved, AllBlocksCleared), and the longest leading run of a prompt's blocks each engine holds.

Blocks are keyed by a content chain the router computes itself: a block's key is the hash of (its
parent's key, its token ids), the first block's parent being the LoRA root. Each engine's own block
hashes are translated to content keys as its events arrive (a BlockStored names the parent's engine
hash and carries the token ids), so the router needs neither the engines' hash seed (vLLM's NONE_HASH
is random unless PYTHONHASHSEED is set) nor their hash algorithm, and every engine's blocks share one
key space.

Memory is bounded in bytes, not only in blocks: every entry has a bounded size (an engine's hash is kept
as the 64-bit int vLLM's events carry by default, a digest sent as bytes is folded to its low 64 bits as
vLLM folds it), at most `blocks_per_engine` blocks per engine and `total_blocks` in all (the oldest an
engine reported dropped first), and adapter names at most `MAX_LORAS_PER_ENGINE` per engine and
`MAX_LORAS` in all, each held while some engine holds blocks under it. Clearing or forgetting an engine
gives its memory back: its names' references, and the holders table rebuilt once it is mostly empty
(a dict never shrinks by deletion alone).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from itertools import islice
from typing import Any

from corral.engine.kv_events import external_hash

# A real engine's GPU cache holds tens of thousands of blocks; 200k covers a large one's whole cache.
DEFAULT_BLOCKS_PER_ENGINE = 200_000
# At ~160 bytes per block held (benchmarks/bench_kv_index.py), 4M blocks is about 0.6 GB per router
# process (each --workers worker keeps its own index).
DEFAULT_TOTAL_BLOCKS = 4_000_000
# An eviction drops this share of the engine's blocks at once, so a full index rebuilds its dict
# rarely (amortized O(1) per block) instead of leaving deleted slots at the front of its order.
_EVICT_SHARE = 8
# How long a block the router sent a request to counts as held before the engine's events confirm it.
DEFAULT_PENDING_SECONDS = 5.0
DEFAULT_PENDING_LIMIT = 65_536
# Adapter names the index keeps (a name is the root of its blocks' chains): vLLM serves a few dozen
# adapters at once; blocks under a name beyond these are not indexed (counted in `unindexed`).
MAX_LORAS_PER_ENGINE = 1024
MAX_LORAS = 16_384
# Rebuild the holders table when it holds less than this share of the most it held.
_SHRINK_SHARE = 4

BASE_ROOT = 0


def lora_root(lora_name: str | None) -> int:
    """The chain's root for blocks computed under a LoRA adapter (BASE_ROOT for the base model)."""
    if not lora_name:
        return BASE_ROOT
    return int.from_bytes(blake2b(lora_name.encode("utf-8"), digest_size=8).digest(), "big")


def content_chain(token_ids: Sequence[int], block_size: int, root: int = BASE_ROOT) -> list[int]:
    """The content key of each full block of `token_ids`: hash((parent key, block's tokens)). Python's
    hash of a tuple of ints does not depend on PYTHONHASHSEED, so every router replica computes the same."""
    keys: list[int] = []
    parent = root
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        keys.append(parent)
    return keys


@dataclass(slots=True)
class _Engine:
    """One engine's blocks: its block hash -> content key, oldest reported first."""

    url: str
    slot: int
    blocks: dict[int, int] = field(default_factory=dict)
    block_size: int | None = None
    loras: set[str] = field(default_factory=set)  # adapter names it stored blocks under
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    orphans: int = 0  # BlockStored whose parent the index does not hold: not reachable from a root
    evicted: int = 0  # blocks dropped for the caps, not by the engine
    unindexed: int = 0  # blocks under an adapter name beyond the names' caps

    @property
    def bit(self) -> int:
        return 1 << self.slot


class KvIndex:
    """Content key -> bitmask of the engines holding the block; each engine's translation table."""

    def __init__(
        self,
        blocks_per_engine: int = DEFAULT_BLOCKS_PER_ENGINE,
        total_blocks: int = DEFAULT_TOTAL_BLOCKS,
        pending_seconds: float = DEFAULT_PENDING_SECONDS,
        pending_limit: int = DEFAULT_PENDING_LIMIT,
    ) -> None:
        if blocks_per_engine < 1 or total_blocks < 1:
            raise ValueError(
                f"KV index caps blocks_per_engine={blocks_per_engine} total_blocks={total_blocks}: "
                "each must be at least 1"
            )
        self.blocks_per_engine = blocks_per_engine
        self.total_blocks = total_blocks
        self.pending_seconds = pending_seconds
        self.pending_limit = pending_limit
        self._engines: dict[str, _Engine] = {}
        self._by_slot: dict[int, _Engine] = {}
        # content key -> its holders: ~slot for a block one engine holds (most blocks; a small int),
        # else the bitmask of their slots (a large int once slots run into the hundreds)
        self._holders: dict[int, int] = {}
        # content key -> (bitmask of engines a request was just sent to, when that hold lapses)
        self._pending: dict[int, tuple[int, float]] = {}
        self._total = 0
        self._holders_peak = 0  # the most content keys held since the table was last rebuilt
        # adapter name -> (its chain root, how many engines hold blocks under it)
        self._lora_roots: dict[str, tuple[int, int]] = {}

    # -- ingestion -------------------------------------------------------------------------------

    def _engine(self, url: str) -> _Engine:
        engine = self._engines.get(url)
        if engine is None:
            slot = next(i for i in range(len(self._engines) + 1) if i not in self._by_slot)
            engine = self._engines[url] = self._by_slot[slot] = _Engine(url, slot)
        return engine

    def stored(
        self,
        url: str,
        block_hashes: Sequence[Hashable],
        parent_hash: Hashable | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_name: str | None = None,
    ) -> int:
        """An engine stored full blocks (one BlockStored); returns how many the index now holds from it.
        Hashes are vLLM's ints or digests as bytes (folded to their low 64 bits, as vLLM folds them)."""
        if block_size < 1:
            return 0  # the feed refuses such an event (kv_event_bounds); never a zero step below
        engine = self._engine(url)
        engine.block_size = block_size
        if parent_hash is None:
            parent = self._hold_root(engine, lora_name, len(block_hashes))
            if parent is None:
                return 0
        else:
            known = engine.blocks.get(_int_hash(parent_hash))
            if known is None:
                engine.orphans += len(block_hashes)
                return 0
            parent = known
        holders, blocks, bit, alone = self._holders, engine.blocks, engine.bit, ~engine.slot
        added = 0
        for i, raw_hash in enumerate(block_hashes):
            engine_hash = raw_hash if type(raw_hash) is int else _int_hash(raw_hash)
            tokens = token_ids[i * block_size : (i + 1) * block_size]
            if len(tokens) < block_size:
                break  # a malformed event: fewer tokens than blocks
            parent = hash((parent, tuple(tokens)))
            old = blocks.get(engine_hash)
            if old is None:
                added += 1
            elif old != parent:
                self._release(old, bit)
            blocks[engine_hash] = parent
            held = holders.get(parent)
            if held is None:
                holders[parent] = alone
            elif held != alone:
                holders[parent] = (1 << ~held if held < 0 else held) | bit
        engine.stored += added
        self._total += added
        if len(holders) > self._holders_peak:
            self._holders_peak = len(holders)
        if len(blocks) > self.blocks_per_engine:
            self._evict(engine, len(blocks) - self.blocks_per_engine)
        if self._total > self.total_blocks:
            largest = max(self._engines.values(), key=lambda e: len(e.blocks))
            self._evict(largest, self._total - self.total_blocks)
        return added

    def root(self, lora_name: str | None) -> int:
        """The chain root of blocks under `lora_name` (computed, not kept)."""
        if not lora_name:
            return BASE_ROOT
        known = self._lora_roots.get(lora_name)
        return known[0] if known is not None else lora_root(lora_name)

    def _hold_root(self, engine: _Engine, lora_name: str | None, blocks: int) -> int | None:
        """The root of `engine`'s blocks under `lora_name`, the name held for it from now on; None when
        the names' caps leave no room for a new one (those blocks are not indexed)."""
        if not lora_name:
            return BASE_ROOT
        if lora_name in engine.loras:
            return self._lora_roots[lora_name][0]
        known = self._lora_roots.get(lora_name)
        full = known is None and len(self._lora_roots) >= MAX_LORAS
        if full or len(engine.loras) >= MAX_LORAS_PER_ENGINE:
            engine.unindexed += blocks
            return None
        root = known[0] if known is not None else lora_root(lora_name)
        self._lora_roots[lora_name] = (root, 1 if known is None else known[1] + 1)
        engine.loras.add(lora_name)
        return root

    def _release_loras(self, engine: _Engine) -> None:
        roots = self._lora_roots
        for name in engine.loras:
            root, engines = roots[name]
            if engines > 1:
                roots[name] = (root, engines - 1)
            else:
                del roots[name]
        engine.loras = set()
        if not roots:
            self._lora_roots = {}  # a dict never shrinks by deletion: give the table back

    def removed(self, url: str, block_hashes: Sequence[Hashable]) -> int:
        """An engine evicted blocks (one BlockRemoved); returns how many the index dropped."""
        engine = self._engines.get(url)
        if engine is None:
            return 0
        dropped = 0
        for engine_hash in block_hashes:
            key = engine.blocks.pop(engine_hash if type(engine_hash) is int else _int_hash(engine_hash), None)
            if key is not None:
                self._release(key, engine.bit)
                dropped += 1
        engine.removed += dropped
        self._total -= dropped
        return dropped

    def cleared(self, url: str) -> None:
        """The engine emptied its cache (AllBlocksCleared, a new engine process): it holds nothing."""
        engine = self._engines.get(url)
        if engine is not None:
            self._clear(engine)
            engine.cleared += 1

    def forget(self, url: str) -> None:
        """Drop everything about an engine (it left membership); its slot is reused."""
        engine = self._engines.pop(url, None)
        if engine is not None:
            self._clear(engine)
            del self._by_slot[engine.slot]
            self._drop_pending(engine.bit)

    def _clear(self, engine: _Engine) -> None:
        bit = engine.bit
        for key in engine.blocks.values():
            self._release(key, bit)
        self._total -= len(engine.blocks)
        engine.blocks = {}
        engine.block_size = None  # a new engine process states its own
        self._release_loras(engine)
        if len(self._holders) * _SHRINK_SHARE < self._holders_peak:
            self._holders = dict(self._holders)
            self._holders_peak = len(self._holders)

    def _release(self, key: int, bit: int) -> None:
        held = self._holders.get(key)
        if held is None:
            return
        mask = (1 << ~held if held < 0 else held) & ~bit
        if not mask:
            del self._holders[key]
        elif mask & (mask - 1):
            self._holders[key] = mask
        else:
            self._holders[key] = ~(mask.bit_length() - 1)

    def _evict(self, engine: _Engine, at_least: int) -> None:
        count = max(at_least, len(engine.blocks) // _EVICT_SHARE)
        bit = engine.bit
        for key in islice(engine.blocks.values(), count):
            self._release(key, bit)
        engine.blocks = dict(islice(engine.blocks.items(), count, None))
        engine.evicted += count
        self._total -= count

    def _drop_pending(self, bit: int) -> None:
        for key, (mask, until) in list(self._pending.items()):
            if mask & bit:
                if mask & ~bit:
                    self._pending[key] = (mask & ~bit, until)
                else:
                    del self._pending[key]

    # -- questions -------------------------------------------------------------------------------

    def watch(self, url: str) -> None:
        """The engine's events are followed from now on: it holds nothing until they say so."""
        self._engine(url)

    def root_of_model(self, model: str) -> int:
        """The chain root of a request for `model`: a LoRA adapter's when engines stored blocks under
        that name, else the base model's."""
        known = self._lora_roots.get(model)
        return BASE_ROOT if known is None else known[0]

    def chain(self, token_ids: Sequence[int], block_size: int, root: int = BASE_ROOT) -> list[int]:
        return content_chain(token_ids, block_size, root)

    def common_block_size(self) -> int | None:
        """A block size some engine reported (engines of one model share it), None before any."""
        return next((e.block_size for e in self._engines.values() if e.block_size is not None), None)

    def indexes(self, url: str) -> bool:
        return url in self._engines

    def holds_blocks(self, url: str) -> bool:
        engine = self._engines.get(url)
        return engine is not None and bool(engine.blocks)

    def block_size(self, url: str) -> int | None:
        engine = self._engines.get(url)
        return engine.block_size if engine is not None else None

    def sent(self, url: str, keys: Sequence[int], now: float | None = None) -> None:
        """A request whose blocks are `keys` went to `url`: count them held there for a few seconds, so a
        burst of one new prefix is not scattered before the engine's events arrive."""
        engine = self._engines.get(url)
        if engine is None or not keys:
            return
        until = (time.monotonic() if now is None else now) + self.pending_seconds
        pending, bit = self._pending, engine.bit
        for key in keys:
            mask = pending[key][0] if key in pending else 0
            pending[key] = (mask | bit, until)
        if len(pending) > self.pending_limit:
            self._trim_pending(until - self.pending_seconds)

    def _trim_pending(self, now: float) -> None:
        live = {k: v for k, v in self._pending.items() if v[1] > now}
        if len(live) > self.pending_limit:
            live = dict(islice(live.items(), len(live) - self.pending_limit // 2, None))
        self._pending = live

    def longest(self, keys: Sequence[int], now: float | None = None) -> dict[str, int]:
        """Per engine holding the first block, how many of `keys` it holds from the first one on (a
        pending hold counts while it lasts). O(len(keys) + engines holding the first block)."""
        if not keys:
            return {}
        holders, pending = self._holders, self._pending
        t = time.monotonic() if now is None else now
        depth: dict[int, int] = {}
        alive = -1
        for i, key in enumerate(keys):
            mask = holders.get(key, 0)
            if mask < 0:
                mask = 1 << ~mask
            if pending:
                hold = pending.get(key)
                if hold is not None and hold[1] > t:
                    mask |= hold[0]
            new = alive & mask if i else mask
            gone = (alive & ~new) if i else 0
            while gone:
                low = gone & -gone
                depth[low.bit_length() - 1] = i
                gone ^= low
            alive = new
            if not alive:
                break
        else:
            while alive:
                low = alive & -alive
                depth[low.bit_length() - 1] = len(keys)
                alive ^= low
        by_slot = self._by_slot
        return {by_slot[slot].url: n for slot, n in depth.items() if slot in by_slot}

    @property
    def blocks(self) -> int:
        """Blocks held, summed over engines."""
        return self._total

    @property
    def distinct_blocks(self) -> int:
        return len(self._holders)

    def to_json(self, url: str) -> dict[str, Any] | None:
        engine = self._engines.get(url)
        if engine is None:
            return None
        return {
            "blocks": len(engine.blocks),
            "block_size": engine.block_size,
            "stored": engine.stored,
            "removed": engine.removed,
            "cleared": engine.cleared,
            "orphans": engine.orphans,
            "evicted": engine.evicted,
            "unindexed": engine.unindexed,
            "adapters": len(engine.loras),
            "capacity": self.blocks_per_engine,
        }


def _int_hash(block_hash: Hashable) -> int:
    """An engine's block hash as the index keeps it: vLLM's int, or a digest's low 64 bits."""
    if type(block_hash) is int:
        return block_hash
    if isinstance(block_hash, bytes):
        return external_hash(block_hash)
    return hash(block_hash)  # only the index's own tests pass other values
