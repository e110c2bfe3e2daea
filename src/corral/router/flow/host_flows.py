"""What the `--workers N` of one host share so that slot shares (corral.router.flow.shares) are the host's:
each worker's requests in flight and waiting per (model, flow), its flows' priority and weight and when
their last request ended, as absolute values in a table of its own in shared memory, read by its
siblings when they judge a flow's share. Each worker then holds a flow to its weighted share of the
host's slots, counting every worker's requests of it and every flow active in any worker.

The same design as the routing journals (corral.router.routing.worker_journal), and their incarnations:
the region is made by the parent before it forks (an anonymous `MAP_SHARED` mapping), one table per
worker with one writer, so nothing takes a lock. A row carries a check word over its contents: a row
read half written is read again (its writer is done within microseconds). A worker reads its
siblings' tables when it judges a share: at each decision while a share binds, else at most every
`REFRESH_SECONDS`. A worker counts a request before it judges it (`SlotShares.claim`), so two workers
deciding at once each see the other's. A row carries its writer's incarnation: when the parent bumps
a worker's incarnation (it died, or is about to start again) its siblings ignore every row of its
earlier life, so a dead worker's counts never hold anyone back.

Bounded: `ROWS` (model, flow) pairs per worker at once. A pair idle past the share window gives its
row back when the table is full; a pair that still finds no row is counted by its worker alone (its
share judged on that worker's requests of it, as before the host counted them) until a row frees.
"""

from __future__ import annotations

import logging
import mmap
import struct
import time
from collections.abc import Sequence
from hashlib import blake2b
from typing import NamedTuple, Protocol

from corral.router.routing.worker_journal import WorkerJournals

log = logging.getLogger("corral.router.flow")

ROWS = 1024  # (model, flow) pairs per worker at once
# While no share binds (one flow of the model active on the host), a worker reads its siblings' tables at
# most this often: the unsaturated path's cost does not grow with the request rate. While shares bind,
# it reads them at each decision.
REFRESH_SECONDS = 0.005
_MASK = (1 << 64) - 1
_HEAD_WORDS = 1  # rows used (a high-water mark)
# check, incarnation, model hash (0: a free row), flow hash, in flight, waiting, priority and weight,
# when its last request ended (monotonic microseconds: CLOCK_MONOTONIC is the host's, in every process)
_ROW_WORDS = 8
_ROW = struct.Struct(f"={_ROW_WORDS}Q")
_HEAD = struct.Struct("=Q")
_PRIORITY_BIAS = 1 << 20
_REREADS = 1000  # priorities are -1000..1000: stored biased, unsigned


def flow_key(text: str) -> int:
    """The 64-bit name of a model or a flow in the tables (the same in every process; never 0)."""
    return int.from_bytes(blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big") or 1


def _check(values: tuple[int, ...]) -> int:
    return hash(values) & _MASK  # int tuples hash alike in every process (no salt)


class FlowUse(Protocol):
    """What a worker publishes of one flow (shares._Use)."""

    priority: int
    weight: int
    in_flight: int
    waiting: int
    idle_since: float


class SiblingFlow(NamedTuple):
    """One flow of a model as a sibling worker counts it."""

    flow: int  # flow_key of its name
    priority: int
    weight: int
    in_flight: int
    waiting: int
    idle_since: float


class _Row:
    """One of this worker's rows: where it is, whose it is, what it last said."""

    __slots__ = ("head", "idle_since", "in_flight", "number", "offset", "waiting")

    def __init__(self, number: int, offset: int, head: tuple[int, int, int]) -> None:
        self.number = number
        self.offset = offset
        self.head = head  # its writer's incarnation, the model's and the flow's keys
        self.in_flight = 0
        self.waiting = 0
        self.idle_since = 0.0


class HostFlowTables:
    """The shared region: one table per worker of `journals`, made before the workers are forked."""

    def __init__(self, journals: WorkerJournals) -> None:
        self.journals = journals
        self.count = journals.count
        self._heads_bytes = 8 * _HEAD_WORDS * self.count
        self._heads = struct.Struct(f"={_HEAD_WORDS * self.count}Q")
        self.map = mmap.mmap(-1, self._heads_bytes + self.count * 8 * ROWS * _ROW_WORDS)

    def head(self, index: int) -> int:
        return 8 * _HEAD_WORDS * (index - 1)

    def row(self, index: int, row: int) -> int:
        return self._heads_bytes + 8 * _ROW_WORDS * (ROWS * (index - 1) + row)

    def heads(self) -> tuple[int, ...]:
        return self._heads.unpack_from(self.map, 0)


class HostFlows:
    """Worker `index`'s side: publishes its flows' counts, reads its siblings'."""

    def __init__(
        self, tables: HostFlowTables, index: int, window: float, refresh: float = REFRESH_SECONDS
    ) -> None:
        self.tables = tables
        self.index = index
        self.window = window  # a row idle this long may be given back when the table is full
        self.refresh = refresh
        self._map = tables.map
        self._head = tables.head(index)
        self.incarnation = tables.journals.incarnations()[index - 1]
        self._rows: dict[tuple[str, str], _Row] = {}
        self._free: list[int] = []
        self._used = 0
        _HEAD.pack_into(self._map, self._head, 0)  # an earlier life's rows: none
        self._keys: dict[str, int] = {}
        self._read_at = float("-inf")
        self._by_model: dict[int, list[SiblingFlow]] = {}
        self.unpublished = 0  # pairs that found no row (counted by this worker alone)
        self.torn = 0  # siblings' rows read half written (read again next time)

    def key(self, text: str) -> int:
        found = self._keys.get(text)
        if found is None:
            if len(self._keys) >= 4 * ROWS:
                self._keys.clear()
            found = self._keys[text] = flow_key(text)
        return found

    # -- writing -------------------------------------------------------------------------------

    def publish(self, model: str, flow: str, use: FlowUse) -> None:
        """`flow`'s counts of `model` in this worker are now `use`'s."""
        row = self._rows.get((model, flow))
        if row is None:
            row = self._take(model, flow, time.monotonic())
            if row is None:
                return
        in_flight, waiting, since = use.in_flight, use.waiting, use.idle_since
        row.in_flight, row.waiting, row.idle_since = in_flight, waiting, since
        body = (
            *row.head,
            in_flight if in_flight > 0 else 0,
            waiting if waiting > 0 else 0,
            (use.priority + _PRIORITY_BIAS) << 32 | use.weight,
            int(since * 1e6) if since > 0 else 0,
        )
        _ROW.pack_into(self._map, row.offset, hash(body) & _MASK, *body)  # the check word: `_check`

    def forget(self, model: str, flow: str) -> None:
        """`flow` of `model` is idle here and forgotten: its row is free."""
        row = self._rows.pop((model, flow), None)
        if row is not None:
            self._release(row)

    def _take(self, model: str, flow: str, now: float) -> _Row | None:
        if not self._free and self._used >= ROWS:
            self._reclaim(now)
        if self._free:
            number = self._free.pop()
        elif self._used < ROWS:
            number = self._used
            self._commit(self.tables.row(self.index, number), (self.incarnation, 0, 0, 0, 0, 0, 0))
            self._used += 1  # counted once the row reads whole (free, until `publish` writes it)
            _HEAD.pack_into(self._map, self._head, self._used)
        else:
            self.unpublished += 1
            if self.unpublished == 1:
                log.warning(
                    "flow control: more than %d (model, flow) pairs active at once in this worker; "
                    "the rest are counted by this worker alone until some go idle",
                    ROWS,
                )
            return None
        head = (self.incarnation, flow_key(model), flow_key(flow))
        row = self._rows[(model, flow)] = _Row(number, self.tables.row(self.index, number), head)
        return row

    def _reclaim(self, now: float) -> None:
        """Give back the rows of pairs idle past the window (the table is full)."""
        window = self.window
        for pair, row in list(self._rows.items()):
            if not row.in_flight and not row.waiting and now - row.idle_since >= window:
                del self._rows[pair]
                self._release(row)

    def _release(self, row: _Row) -> None:
        self._commit(row.offset, (self.incarnation, 0, 0, 0, 0, 0, 0))
        self._free.append(row.number)

    def _commit(self, offset: int, body: tuple[int, ...]) -> None:
        _ROW.pack_into(self._map, offset, _check(body), *body)

    # -- reading -------------------------------------------------------------------------------

    def siblings(self, model: str, now: float, fresh: bool = False) -> Sequence[SiblingFlow]:
        """The flows of `model` the siblings counted at most `refresh` seconds before `now`, or at `now`
        when `fresh` (live workers' rows only)."""
        read_at = self._read_at
        if now - read_at >= self.refresh or now < read_at or (fresh and now != read_at):
            self._read(now)
        return self._by_model.get(self.key(model), ())

    def _reread(self, offset: int) -> tuple[int, ...] | None:
        """A row read half written, read again until it reads whole: its writer is mid-write and done
        within microseconds (None: still torn after `_REREADS` tries, skipped this time)."""
        self.torn += 1
        for _ in range(_REREADS):
            got = _ROW.unpack_from(self._map, offset)
            if _check(got[1:]) == got[0]:
                return got
        return None

    def read_at(self, now: float) -> bool:
        """Whether the siblings' tables were read at `now`."""
        return self._read_at == now

    def _read(self, now: float) -> None:
        incarnations = self.tables.journals.incarnations()
        heads = self.tables.heads()
        by_model: dict[int, list[SiblingFlow]] = {}
        torn = False
        for index in range(1, self.tables.count + 1):
            if index == self.index:
                continue
            incarnation = incarnations[index - 1]
            used = min(heads[_HEAD_WORDS * (index - 1)], ROWS)
            for row in range(used):
                got = _ROW.unpack_from(self._map, self.tables.row(index, row))
                if _check(got[1:]) != got[0]:
                    again = self._reread(self.tables.row(index, row))
                    if again is None:
                        torn = True
                        continue
                    got = again
                _, row_incarnation, model_key, flow, in_flight, waiting, mix, since = got
                if row_incarnation != incarnation or not model_key:
                    continue  # an earlier life's, or a free row
                sibling = SiblingFlow(
                    flow, (mix >> 32) - _PRIORITY_BIAS, mix & 0xFFFFFFFF, in_flight, waiting, since / 1e6
                )
                by_model.setdefault(model_key, []).append(sibling)
        self._by_model = by_model
        # a torn row is being written: read again at the next call
        self._read_at = float("-inf") if torn else now
