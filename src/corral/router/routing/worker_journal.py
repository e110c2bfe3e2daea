"""What the `--workers N` of one host share so that they route as one router: each worker's picks (the
prompt's prefix keys and the endpoint, for the prefix memory and the recent-picks scorer) and its
requests in flight per endpoint (and of those, the prefill queue: the requests before their first byte
and the prompt tokens they are expected to compute), written to a journal of its own in shared memory
and read by its siblings before each of their picks.

The region is made by the parent before it forks (an anonymous `MAP_SHARED` mapping, inherited by every
worker), one journal per worker: a header (incarnation, cursors) and two rings of fixed-size records.
Each journal has one writer, so nothing takes a lock; a record carries its sequence number and a check
word over its contents, so a record overwritten while it was read (a reader lapped) or read half
written is seen as such and skipped. In-flight records carry absolute counts, so a skipped one costs
accuracy until that endpoint's next change, never a count that drifts. The parent bumps a worker's
incarnation when it dies and before it starts again: siblings then drop what it had in flight.

A sibling's pick is applied as the worker's own would be (`PrefixMemory.remember`, the policy's
recent picks), and a sibling's in-flight count is added to the endpoint's host-wide count
(`Endpoint.host_in_flight`, which the policies and the load bound read); each worker's own
`in_flight` stays its own, as the drain's acknowledgements and /v1/fleet count it.

The pick rings are also what a router serves its peer replicas (`--peer`, `pick_log`): any worker
answers with every worker's picks. A peer's pick that worker 1 applied (`peer_follower`) is written
here marked relayed, so that its siblings apply it too and no peer is ever served it back.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import mmap
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from hashlib import blake2b

from corral.router.membership.endpoint import Endpoint
from corral.router.membership.membership import Membership
from corral.router.routing.pipeline import ScoredPolicy
from corral.router.routing.placement_lock import PlacementLock
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.prompt import MAX_KEYS
from corral.router.routing.request import Policy, RouteRequest
from corral.router.routing.selector import Routing

log = logging.getLogger("corral.router.worker_journal")

_MASK = (1 << 64) - 1
_HEADER_WORDS = 4  # incarnation, picks written, in-flight records written, (spare)
_PICK_HEAD = 5  # seq, check, incarnation << 17 | relayed << 16 | policy << 8 | keys, url hash, epoch hash
_PICK_WORDS = _PICK_HEAD + MAX_KEYS
# seq, check, incarnation, url hash, count, prefill tokens, prefilling (the requests before their first byte)
_FLIGHT_WORDS = 7
# Ring sizes: a reader drains before each pick and every `DRAIN_SECONDS`, so a ring laps only if its
# writer makes this many records in that time (far past what one Python worker serves).
PICKS_KEPT = 4096
FLIGHTS_KEPT = 16384
DRAIN_SECONDS = 0.1
_PICK = struct.Struct(f"={_PICK_WORDS}Q")
_FLIGHT = struct.Struct(f"={_FLIGHT_WORDS}Q")
_WORD = struct.Struct("=Q")
# A pick this router learnt from a peer router (`peer_follower`), not made here: its siblings apply it,
# the log served to peers (`pick_log`) leaves it out, so no pick echoes back to where it was made.
_RELAYED = 1 << 16


def hash_url(url: str) -> int:
    """The 64-bit name of an endpoint url in the journals (the same in every process)."""
    return _hash(url)


def hash_epoch(epoch: str | None) -> int:
    """The 64-bit name of a prefix epoch (0: none), as the journals and the peers' picks carry it."""
    return _hash(epoch) if epoch is not None else 0


def apply_pick(
    memory: PrefixMemory, endpoint: Endpoint, keys: Sequence[int], policy: Policy | None, now: float
) -> None:
    """Another router's pick of `endpoint` (a sibling worker's or a peer replica's), applied as this
    router's own would be: its prompt's prefix keys learnt (`keys`: empty when they do not apply), and
    a recent pick of `policy` (None: a policy this router does not run)."""
    remember = memory.remember
    for depth, key in enumerate(keys):
        remember(key, endpoint, first=depth == 0)
    if isinstance(policy, ScoredPolicy):
        policy.recent_pick(endpoint, now)


def _hash(text: str) -> int:
    return int.from_bytes(blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def _check(values: Sequence[int]) -> int:
    # int and tuple hashes are not salted per process (only str and bytes are): every worker agrees
    return hash(tuple(values)) & _MASK


class WorkerJournals:
    """The shared region: `count` journals, made before the workers are forked."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"count {count}: must be at least 1")
        self.count = count
        self._journal_bytes = 8 * (PICKS_KEPT * _PICK_WORDS + FLIGHTS_KEPT * _FLIGHT_WORDS)
        self._headers_bytes = 8 * _HEADER_WORDS * count
        self.map = mmap.mmap(-1, self._headers_bytes + count * self._journal_bytes)
        # new prefix placements one worker at a time (placement_lock); one worker needs none
        self.placement_lock = PlacementLock() if count > 1 else None
        self._headers = struct.Struct(f"={_HEADER_WORDS * count}Q")

    def header(self, index: int) -> int:
        """The byte offset of worker `index`'s header (1..count)."""
        return 8 * _HEADER_WORDS * (index - 1)

    def picks(self, index: int) -> int:
        return self._headers_bytes + (index - 1) * self._journal_bytes

    def flights(self, index: int) -> int:
        return self.picks(index) + 8 * PICKS_KEPT * _PICK_WORDS

    def headers(self) -> tuple[int, ...]:
        return self._headers.unpack_from(self.map, 0)

    def incarnations(self) -> tuple[int, ...]:
        """Each worker's incarnation now (worker 1's first): a record of an earlier one is stale."""
        return self.headers()[::_HEADER_WORDS]

    def picks_written(self, index: int) -> int:
        """How many picks worker `index` has written (the last one's sequence number)."""
        (written,) = _WORD.unpack_from(self.map, self.header(index) + 8)
        return int(written)

    def read_pick(self, index: int, seq: int) -> PickRecord | None:
        """Worker `index`'s pick number `seq`, if its ring still holds it whole (None: lapped, torn,
        or not written yet)."""
        if seq < 1:
            return None
        got = _PICK.unpack_from(self.map, self.picks(index) + 8 * _PICK_WORDS * ((seq - 1) % PICKS_KEPT))
        if got[0] != seq or _check((seq, *got[2:])) != got[1]:
            return None
        meta, url_hash, epoch = got[2:_PICK_HEAD]
        keys = got[_PICK_HEAD : _PICK_HEAD + min(meta & 0xFF, MAX_KEYS)]
        return PickRecord(url_hash, epoch, meta >> 8 & 0xFF, keys, bool(meta & _RELAYED))

    def new_incarnation(self, index: int) -> None:
        """Worker `index` died or is about to start (the parent calls this): its siblings drop what it
        had in flight, and skip any record of its earlier life they have not read yet."""
        offset = self.header(index)
        (incarnation,) = _WORD.unpack_from(self.map, offset)
        _WORD.pack_into(self.map, offset, incarnation + 1)


@dataclass(frozen=True, slots=True)
class PickRecord:
    """One pick as a journal holds it."""

    url_hash: int
    epoch_hash: int  # the endpoint's prefix epoch when it was picked (0: none)
    policy_index: int  # in the host's policies (255: not a scored policy's)
    keys: tuple[int, ...]  # the prompt's prefix keys, shallowest first (empty: not learnt)
    relayed: bool  # learnt from a peer router, not picked here


class _Sibling:
    __slots__ = ("flights", "incarnation", "index", "next_flight", "next_pick")

    def __init__(self, index: int, incarnation: int, picks: int, flights: int) -> None:
        self.index = index
        self.incarnation = incarnation
        self.next_pick = picks  # records read (the next one's seq is this + 1)
        self.next_flight = flights
        # url hash -> (endpoint, its count, prefill tokens, prefilling)
        self.flights: dict[int, tuple[Endpoint, int, int, int]] = {}


class WorkerSync:
    """One worker's side: writes its picks and in-flight counts, reads its siblings' before each pick
    (`policy`) and every `DRAIN_SECONDS`."""

    def __init__(
        self,
        journals: WorkerJournals,
        index: int,
        lookup: Callable[[str], Endpoint | None],
        urls: Callable[[], Sequence[str]],
        memory: PrefixMemory,
        policies: Sequence[Policy],
    ) -> None:
        self.journals = journals
        self.index = index
        self.lookup = lookup  # url -> the endpoint membership holds now
        self.urls = urls  # every url membership holds (to resolve a sibling's url hash)
        self.memory = memory
        self.policies = list(policies)  # built in the same order in every worker: a pick names its index
        self._policy_index = {id(p): i for i, p in enumerate(self.policies)}
        self._map = journals.map
        self._header = journals.header(index)
        self._picks_at = journals.picks(index)
        self._flights_at = journals.flights(index)
        headers = journals.headers()
        base = _HEADER_WORDS * (index - 1)
        self.incarnation, self._picks_written, self._flights_written = headers[base : base + 3]
        self._siblings = [
            _Sibling(k, *headers[_HEADER_WORDS * (k - 1) : _HEADER_WORDS * (k - 1) + 3])
            for k in range(1, journals.count + 1)
            if k != index
        ]
        self._url_hashes: dict[str, int] = {}
        self._urls_by_hash: dict[int, str] = {}
        self._resolved_at = -1.0
        self._epoch_hashes: dict[str | None, int] = {None: 0}
        self._timer: asyncio.TimerHandle | None = None
        self.applied = 0  # siblings' records applied
        self.skipped = 0  # records lapped or torn

    # -- writing -------------------------------------------------------------------------------

    def _url_hash(self, url: str) -> int:
        found = self._url_hashes.get(url)
        if found is None:
            if len(self._url_hashes) > 65536:  # endpoints long gone
                self._url_hashes.clear()
            found = self._url_hashes[url] = hash_url(url)
        return found

    def epoch_hash(self, endpoint: Endpoint) -> int:
        """The hash of `endpoint`'s prefix epoch now (what a pick of it carries)."""
        return self._epoch_hash(endpoint)

    def _epoch_hash(self, endpoint: Endpoint) -> int:
        view = endpoint.supervisor
        epoch = view.prefix_epoch if view is not None else None
        found = self._epoch_hashes.get(epoch)
        if found is None:
            if len(self._epoch_hashes) > 65536:
                self._epoch_hashes = {None: 0}
            found = self._epoch_hashes[epoch] = hash_epoch(epoch)
        return found

    def picked(self, policy: Policy, request: RouteRequest, endpoint: Endpoint, learnt: bool) -> None:
        """This worker's `policy` picked `endpoint` for `request` (and its prefix memory learnt the
        prompt's keys, when `learnt`)."""
        keys = [key for key, _ in self.memory.keys(request)] if learnt else []
        self._write_pick(policy, endpoint, keys, 0)

    def relay(self, policy: Policy | None, endpoint: Endpoint, keys: Sequence[int]) -> None:
        """A peer router's pick, applied here (`apply_pick`): written for the siblings to apply too,
        marked so that it is never served back to a peer."""
        self._write_pick(policy, endpoint, keys[:MAX_KEYS], _RELAYED)

    def _write_pick(self, policy: Policy | None, endpoint: Endpoint, keys: Sequence[int], flags: int) -> None:
        seq = self._picks_written + 1
        index = self._policy_index.get(id(policy), 255) if policy is not None else 255
        meta = self.incarnation << 17 | flags | index << 8 | len(keys)
        body = [meta, self._url_hash(endpoint.url), self._epoch_hash(endpoint), *keys]
        body += [0] * (_PICK_WORDS - _PICK_HEAD - len(keys))
        offset = self._picks_at + 8 * _PICK_WORDS * ((seq - 1) % PICKS_KEPT)
        _PICK.pack_into(self._map, offset, seq, _check([seq, *body]), *body)
        self._picks_written = seq
        _WORD.pack_into(self._map, self._header + 8, seq)

    def in_flight(self, url: str, count: int, prefill_tokens: int = 0, prefilling: int = 0) -> None:
        """This worker now has `count` requests open at `url`, `prefilling` of them before their first
        byte with `prefill_tokens` to compute (`Endpoint.on_in_flight`)."""
        seq = self._flights_written + 1
        url_hash = self._url_hash(url)
        offset = self._flights_at + 8 * _FLIGHT_WORDS * ((seq - 1) % FLIGHTS_KEPT)
        body = (self.incarnation, url_hash, count, prefill_tokens, prefilling)
        _FLIGHT.pack_into(self._map, offset, seq, _check((seq, *body)), *body)
        self._flights_written = seq
        _WORD.pack_into(self._map, self._header + 16, seq)

    # -- reading -------------------------------------------------------------------------------

    @contextmanager
    def placing(self) -> Iterator[None]:
        """A new prefix placement: under the host's placement lock (at most `placement_lock.WAIT_SECONDS`
        of waiting), after reading what the siblings placed; the pick written before the lock goes."""
        lock = self.journals.placement_lock
        held = lock.acquire() if lock is not None else False
        try:
            self.drain()
            yield
        finally:
            if held:
                assert lock is not None
                lock.release()

    def policy(self, inner: Policy) -> Policy:
        """`inner`, reading the siblings' journals before each pick."""
        return _DrainFirst(inner, self)

    def drain(self) -> None:
        """Apply every record the siblings wrote since the last drain."""
        if self._timer is None:
            self._arm()
        headers = self.journals.headers()
        for sibling in self._siblings:
            base = _HEADER_WORDS * (sibling.index - 1)
            incarnation, picks, flights = headers[base : base + 3]
            if incarnation != sibling.incarnation:
                self._reborn(sibling, incarnation)
            if flights != sibling.next_flight:
                self._read_flights(sibling, flights)
            if picks != sibling.next_pick:
                self._read_picks(sibling, picks)

    def _arm(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(DRAIN_SECONDS, self._tick)

    def _tick(self) -> None:
        self._timer = None
        try:
            self.drain()
        except Exception:  # never stop draining over one bad record
            log.exception("reading the sibling workers' journals failed")
            self._arm()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _reborn(self, sibling: _Sibling, incarnation: int) -> None:
        """The sibling died or started again: what it had in flight is gone."""
        for endpoint, count, tokens, prefilling in sibling.flights.values():
            endpoint.sibling_in_flight(-count, -tokens, -prefilling)
        sibling.flights.clear()
        sibling.incarnation = incarnation

    def resolve(self, url_hash: int) -> Endpoint | None:
        """The endpoint membership holds now at the url of `url_hash` (None: none this worker knows)."""
        return self._resolve(url_hash)

    def _resolve(self, url_hash: int) -> Endpoint | None:
        url = self._urls_by_hash.get(url_hash)
        if url is None:
            now = time.monotonic()
            if now - self._resolved_at < 1.0:  # an endpoint this worker does not have (yet)
                return None
            self._resolved_at = now
            self._urls_by_hash = {self._url_hash(u): u for u in self.urls()}
            url = self._urls_by_hash.get(url_hash)
            if url is None:
                return None
        return self.lookup(url)

    def _read_flights(self, sibling: _Sibling, written: int) -> None:
        first = sibling.next_flight + 1
        if written - first >= FLIGHTS_KEPT:  # lapped: start again from what the ring still holds
            self.skipped += written - first + 1 - FLIGHTS_KEPT
            self._reborn(sibling, sibling.incarnation)
            first = written - FLIGHTS_KEPT + 1
        base = self.journals.flights(sibling.index)
        flights = sibling.flights
        for seq in range(first, written + 1):
            got = _FLIGHT.unpack_from(self._map, base + 8 * _FLIGHT_WORDS * ((seq - 1) % FLIGHTS_KEPT))
            if got[0] != seq or _check((seq, *got[2:])) != got[1]:
                self.skipped += 1
                continue
            _, _, incarnation, url_hash, count, tokens, prefilling = got
            if incarnation != sibling.incarnation:
                if incarnation < sibling.incarnation:
                    continue  # the life before its restart
                self._reborn(sibling, incarnation)
            endpoint = self._resolve(url_hash)
            before = flights.get(url_hash)
            if before is not None:
                was, old, old_tokens, old_prefilling = before
                if was is endpoint:
                    endpoint.sibling_in_flight(count - old, tokens - old_tokens, prefilling - old_prefilling)
                    flights[url_hash] = (endpoint, count, tokens, prefilling)
                    self.applied += 1
                    continue
                was.sibling_in_flight(-old, -old_tokens, -old_prefilling)  # a new endpoint at the address
                del flights[url_hash]
            if endpoint is not None:
                endpoint.sibling_in_flight(count, tokens, prefilling)
                flights[url_hash] = (endpoint, count, tokens, prefilling)
                self.applied += 1
        sibling.next_flight = written

    def _read_picks(self, sibling: _Sibling, written: int) -> None:
        first = sibling.next_pick + 1
        if written - first >= PICKS_KEPT:
            self.skipped += written - first + 1 - PICKS_KEPT
            first = written - PICKS_KEPT + 1
        base = self.journals.picks(sibling.index)
        now = time.monotonic()
        for seq in range(first, written + 1):
            got = _PICK.unpack_from(self._map, base + 8 * _PICK_WORDS * ((seq - 1) % PICKS_KEPT))
            if got[0] != seq or _check((seq, *got[2:])) != got[1]:
                self.skipped += 1
                continue
            meta, url_hash, epoch_hash = got[2:_PICK_HEAD]
            if meta >> 17 < sibling.incarnation:
                continue
            endpoint = self._resolve(url_hash)
            if endpoint is None:
                continue
            policy_index, keys = meta >> 8 & 0xFF, min(meta & 0xFF, MAX_KEYS)
            # the prefix cache the sibling saw; a changed epoch on either side: the keys no longer apply
            learnt = got[_PICK_HEAD : _PICK_HEAD + keys] if epoch_hash == self._epoch_hash(endpoint) else ()
            policy = self.policies[policy_index] if policy_index < len(self.policies) else None
            apply_pick(self.memory, endpoint, learnt, policy, now)
            self.applied += 1
        sibling.next_pick = written


class _DrainFirst:
    """A policy that reads the sibling workers' journals before it picks."""

    __slots__ = ("inner", "name", "sync")

    def __init__(self, inner: Policy, sync: WorkerSync) -> None:
        self.inner = inner
        self.sync = sync
        self.name = inner.name

    def pick(self, candidates: Sequence[Endpoint], request: RouteRequest) -> Endpoint:
        self.sync.drain()
        return self.inner.pick(candidates, request)


def route_as_one(
    journals: WorkerJournals, index: int, membership: Membership, routing: Routing, memory: PrefixMemory
) -> WorkerSync:
    """Make worker `index`'s routing read and write the host's journals: its endpoints tell their
    in-flight changes, its scored policies their picks, and its policy reads the siblings' first."""
    policies = list(routing.selector.policies.values())
    sync = WorkerSync(
        journals, index, membership.get, lambda: [e.url for e in membership.endpoints()], memory, policies
    )
    membership.on_in_flight = sync.in_flight
    for endpoint in membership.endpoints():
        endpoint.on_in_flight = sync.in_flight
    for policy in policies:
        if isinstance(policy, ScoredPolicy):
            policy.on_pick = functools.partial(sync.picked, policy)
            if journals.placement_lock is not None:
                policy.placing = sync.placing
    routing.policy = sync.policy(routing.policy)
    return sync
