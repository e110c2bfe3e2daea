"""The workers of one host route as one (`routing.worker_journal`): a prefix one worker placed is held
for its siblings, and the in-flight counts the policies read are the host's, while each worker's own
count (what a drain's acknowledgement and /v1/fleet count) stays its own. Two workers are two routing
stacks on one shared region here, as they are after the fork."""

from __future__ import annotations

import multiprocessing
import struct
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.membership.membership import Membership
from corral.router.routing import worker_journal
from corral.router.routing.config import RoutingConfig
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.request import RouteRequest
from corral.router.routing.selector import Routing
from corral.router.routing.worker_journal import WorkerJournals, WorkerSync, route_as_one
from corral.router.telemetry.metrics import RouterCollector, RouterMetrics

MODEL = "m"
SYSTEM = "You are the harbour master's assistant; answer from the tide tables. " * 12


class Worker:
    """One worker's routing, as `app.build_app` makes it."""

    def __init__(self, journals: WorkerJournals | None, index: int, engines: int) -> None:
        self.membership = Membership()
        for i in range(engines):
            supervisor = SupervisorView(
                f"http://10.0.1.{i}:9000", link="connected", state=EngineState.READY, prefix_epoch="1:0"
            )
            endpoint = Endpoint(
                f"http://10.0.0.{i}:8000", frozenset({MODEL}), EngineState.READY, supervisor=supervisor
            )
            self.membership.add(endpoint, "test")
        self.memory = PrefixMemory()
        self.routing = Routing(
            "prefix",
            RoutingConfig(),
            "x-session-id",
            self.membership.endpoints,
            seed=index,
            prefix_memory=self.memory,
        )
        self.sync: WorkerSync | None = None
        if journals is not None:
            self.sync = route_as_one(journals, index, self.membership, self.routing, self.memory)

    def pick(self, group: int, turn: int = 0) -> str:
        return self.routing.policy.pick(self.membership.eligible(MODEL), request(group, turn)).url

    def endpoint(self, url: str) -> Endpoint:
        found = self.membership.get(url)
        assert found is not None
        return found


def request(group: int, turn: int = 0) -> RouteRequest:
    payload = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": f"Group {group}. {SYSTEM}"},
            {"role": "user", "content": f"question {turn}"},
        ],
    }
    return RouteRequest(MODEL, {}, payload)


def alternate(workers: list[Worker], groups: int, turns: int) -> dict[int, set[str]]:
    """Each group's requests, taken by the workers in turn (as the kernel spreads connections): the
    engines each group went to."""
    placed: dict[int, set[str]] = {g: set() for g in range(groups)}
    k = 0
    for turn in range(turns):
        for g in range(groups):
            placed[g].add(workers[k % len(workers)].pick(g, turn))
            k += 1
    return placed


def test_a_prefix_one_worker_placed_is_held_for_its_sibling() -> None:
    journals = WorkerJournals(2)
    workers = [Worker(journals, 1, 4), Worker(journals, 2, 4)]
    placed = alternate(workers, groups=11, turns=6)
    assert all(len(engines) == 1 for engines in placed.values()), placed
    assert len(set().union(*placed.values())) == 4  # the groups still spread over every engine
    # every worker knows every group's engine, whichever worker placed it
    for w in workers:
        assert sum(w.memory.placed(e) for e in w.membership.endpoints()) == 11


def test_without_the_journals_two_workers_split_prefixes() -> None:
    """What `--workers 2` did before: each worker placed the groups by its own recent picks."""
    workers = [Worker(None, 1, 4), Worker(None, 2, 4)]
    placed = alternate(workers, groups=11, turns=6)
    assert any(len(engines) > 1 for engines in placed.values())


def test_in_flight_is_the_hosts_for_routing_and_each_workers_own_for_acks() -> None:
    journals = WorkerJournals(3)
    w1, w2, w3 = (Worker(journals, k, 2) for k in (1, 2, 3))
    url = w1.membership.endpoints()[0].url
    w1.endpoint(url).in_flight += 3
    w3.endpoint(url).in_flight += 2
    assert w2.sync is not None
    w2.sync.drain()
    seen = w2.endpoint(url)
    assert (seen.in_flight, seen.host_in_flight) == (0, 5)
    assert w2.membership.eligible(MODEL).in_flight == 5  # the load bound's total is the host's
    seen.in_flight += 1
    assert (seen.in_flight, seen.host_in_flight) == (1, 6)
    w1.endpoint(url).in_flight -= 3
    w2.sync.drain()
    assert seen.host_in_flight == 3
    journals.new_incarnation(3)  # w3 died: what it had in flight is gone
    w2.sync.drain()
    assert (seen.in_flight, seen.host_in_flight) == (1, 1)
    assert w2.membership.eligible(MODEL).in_flight == 1


def test_the_prefill_queue_is_the_hosts_too() -> None:
    """Placement by cost waits behind every worker's requests before their first byte (issue 28)."""
    journals = WorkerJournals(3)
    w1, w2, w3 = (Worker(journals, k, 2) for k in (1, 2, 3))
    url = w1.membership.endpoints()[0].url
    for worker, tokens in ((w1, 300), (w1, 200), (w3, 700)):
        endpoint = worker.endpoint(url)
        endpoint.in_flight += 1
        endpoint.prefill_sent(tokens)
    assert w2.sync is not None
    w2.sync.drain()
    seen = w2.endpoint(url)
    assert (seen.host_in_flight, seen.host_prefilling, seen.host_prefill_tokens) == (3, 3, 1200)
    w1.endpoint(url).prefill_done(300)  # its first byte: decoding now, still in flight
    w2.sync.drain()
    assert (seen.host_in_flight, seen.host_prefilling, seen.host_prefill_tokens) == (3, 2, 900)
    journals.new_incarnation(3)  # w3 died: its queue is gone
    w2.sync.drain()
    assert (seen.host_in_flight, seen.host_prefilling, seen.host_prefill_tokens) == (2, 1, 200)
    assert (seen.prefilling, seen.prefill_tokens) == (0, 0)  # w2's own


def test_a_restarted_worker_is_read_from_its_new_life_only() -> None:
    journals = WorkerJournals(2)
    w1, w2 = Worker(journals, 1, 2), Worker(journals, 2, 2)
    url = w1.membership.endpoints()[0].url
    w1.endpoint(url).in_flight += 4
    journals.new_incarnation(1)  # died, unread by w2
    journals.new_incarnation(1)  # started again
    again = Worker(journals, 1, 2)
    again.endpoint(url).in_flight += 1
    assert w2.sync is not None
    w2.sync.drain()
    assert w2.endpoint(url).host_in_flight == 1


def test_a_lapped_reader_keeps_the_latest_counts_and_a_torn_record_is_skipped() -> None:
    journals = WorkerJournals(2)
    w1, w2 = Worker(journals, 1, 2), Worker(journals, 2, 2)
    a, b = (e.url for e in w1.membership.endpoints())
    w1.endpoint(b).in_flight = 7
    for _ in range(worker_journal.FLIGHTS_KEPT):
        w1.endpoint(a).in_flight += 1
        w1.endpoint(a).in_flight -= 1
    w1.endpoint(a).in_flight = 2
    assert w2.sync is not None
    w2.sync.drain()
    # b's last record was lapped: counted as 0 until its next change, never a drift
    assert (w2.endpoint(a).host_in_flight, w2.endpoint(b).host_in_flight) == (2, 0)
    assert w2.sync.skipped > 0
    w1.endpoint(b).in_flight = 6
    # the next record, torn (its count changed after its check was written): skipped, then corrected
    w1.endpoint(a).in_flight = 9
    seq = w1.sync._flights_written if w1.sync is not None else 0
    offset = journals.flights(1) + 8 * worker_journal._FLIGHT_WORDS * (
        (seq - 1) % worker_journal.FLIGHTS_KEPT
    )
    struct.pack_into("=Q", journals.map, offset + 8 * 4, 1234)
    skipped = w2.sync.skipped
    w2.sync.drain()
    assert w2.sync.skipped == skipped + 1
    assert (w2.endpoint(a).host_in_flight, w2.endpoint(b).host_in_flight) == (2, 6)
    w1.endpoint(a).in_flight = 3
    w2.sync.drain()
    assert w2.endpoint(a).host_in_flight == 3


def test_a_siblings_keys_from_another_prefix_epoch_are_not_learnt() -> None:
    journals = WorkerJournals(2)
    w1, w2 = Worker(journals, 1, 2), Worker(journals, 2, 2)
    url = w1.pick(5)
    view = w2.endpoint(url).supervisor
    assert view is not None
    view.prefix_epoch = "1:1"  # w2 already saw the engine's cache reset; w1's pick was before it
    assert w2.sync is not None
    w2.sync.drain()
    assert w2.memory.placed(w2.endpoint(url)) == 0


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.booleans(), st.booleans()), max_size=60)
)
def test_every_worker_reads_the_sum_of_all_workers_counts(steps: list[tuple[int, int, bool, bool]]) -> None:
    journals = WorkerJournals(3)
    workers = [Worker(journals, k, 3) for k in (1, 2, 3)]
    urls = [e.url for e in workers[0].membership.endpoints()]
    for who, which, start, drain in steps:
        endpoint = workers[who].endpoint(urls[which])
        if start or endpoint.in_flight == 0:
            endpoint.in_flight += 1
        else:
            endpoint.in_flight -= 1
        sync = workers[who].sync
        if drain and sync is not None:
            sync.drain()
    for w in workers:
        assert w.sync is not None
        w.sync.drain()
        for url in urls:
            assert w.endpoint(url).host_in_flight == sum(x.endpoint(url).in_flight for x in workers)
        assert w.membership.eligible(MODEL).in_flight == sum(
            x.endpoint(u).in_flight for x in workers for u in urls
        )


def _place_in_step(journals: WorkerJournals, index: int, rounds: int, barrier: Any, out: Any) -> None:
    """A forked worker: in each round, at the same instant as its sibling (the barrier), place one new
    group; send back where each went."""
    worker = Worker(journals, index, 4)
    placed = []
    for r in range(rounds):
        barrier.wait(timeout=20)
        placed.append(worker.pick(2 * r + index - 1))
    lock = journals.placement_lock
    out.send((placed, lock.waited_out if lock is not None else None))
    out.close()


def test_two_workers_placing_new_prefixes_at_the_same_instant_spread_them_evenly() -> None:
    """Two forked workers on one host place a new group each at the same instant, round after round.
    Each placement takes the host's placement lock and reads the other's picks first, so every one sees
    all those before it: the engines end with as many groups each (give or take one). Without the lock,
    both scored with the same view and put their groups on the same engine."""
    context = multiprocessing.get_context("fork")
    journals = WorkerJournals(2)
    assert journals.placement_lock is not None
    # a loaded machine may deschedule the holder for longer than the production bound: wait it out here
    journals.placement_lock.wait_seconds = 10.0
    barrier = context.Barrier(2)
    rounds = 12
    pipes = [context.Pipe(duplex=False) for _ in range(2)]
    workers = [
        context.Process(target=_place_in_step, args=(journals, i + 1, rounds, barrier, pipes[i][1]))
        for i in range(2)
    ]
    for process in workers:
        process.start()
    try:
        placed = [pipes[i][0].recv() if pipes[i][0].poll(60) else None for i in range(2)]
    finally:
        for process in workers:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    assert placed[0] is not None and placed[1] is not None, "a worker did not answer"
    (first, first_waited_out), (second, second_waited_out) = placed
    counts = Counter(first + second)
    assert len(counts) == 4 and max(counts.values()) - min(counts.values()) <= 1, counts
    assert first_waited_out == 0 and second_waited_out == 0  # each placement had the lock


def test_placements_made_without_the_lock_are_on_the_metrics_page() -> None:
    """A worker that waited out a sibling's hold on the placement lock says so on /metrics; a sibling that
    holds the lock (another process: POSIX record locks are per process) makes this one wait it out."""
    context = multiprocessing.get_context("fork")
    journals = WorkerJournals(2)
    lock = journals.placement_lock
    assert lock is not None
    holding, release = context.Event(), context.Event()

    def hold() -> None:
        assert lock.acquire()
        holding.set()
        release.wait(20)
        lock.release()

    sibling = context.Process(target=hold)
    sibling.start()
    try:
        assert holding.wait(20)
        assert not lock.acquire()  # waited 2 ms, then gave up: counted
        release.set()
        sibling.join(10)
        assert lock.acquire()  # free again
        lock.release()
    finally:
        release.set()
        sibling.join(10)
        if sibling.is_alive():
            sibling.kill()
    metrics = RouterMetrics()
    metrics.placement_waited_out = lambda: lock.waited_out
    registry = CollectorRegistry()
    registry.register(RouterCollector(metrics, list))
    page = generate_latest(registry).decode()
    assert "corral_router_placement_lock_waited_out_total 1.0" in page
