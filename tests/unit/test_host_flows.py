"""The host's counts per flow for slot shares (corral.router.flow.host_flows): two workers are two
`HostFlows` over one shared region here, as they are after the fork. What one publishes the other reads
as absolute counts; a dead worker's rows count for nothing once the parent bumps its incarnation; the
table is bounded and a flow beyond it is counted by its worker alone."""

from __future__ import annotations

import struct
import time

import pytest

from corral.router.flow import host_flows
from corral.router.flow.host_flows import HostFlows, HostFlowTables, SiblingFlow, flow_key
from corral.router.routing.worker_journal import WorkerJournals


class Use:
    def __init__(self, in_flight: int = 0, waiting: int = 0, priority: int = 0, weight: int = 1) -> None:
        self.priority = priority
        self.weight = weight
        self.in_flight = in_flight
        self.waiting = waiting
        self.idle_since = 0.0


def now(worker: HostFlows, model: str) -> list[SiblingFlow]:
    """What `worker` reads of its siblings' flows of `model` now."""
    return list(worker.siblings(model, time.monotonic()))


def host(workers: int = 2) -> tuple[HostFlowTables, list[HostFlows]]:
    tables = HostFlowTables(WorkerJournals(workers))
    return tables, [HostFlows(tables, index, 2.0, refresh=0.0) for index in range(1, workers + 1)]


def test_a_sibling_reads_what_a_worker_publishes_as_absolute_counts() -> None:
    _, (one, two) = host()
    use = Use(in_flight=3, waiting=2, priority=-5, weight=7)
    use.idle_since = 1234.5
    one.publish("m", "heavy", use)
    assert now(two, "m") == [SiblingFlow(flow_key("heavy"), -5, 7, 3, 2, 1234.5)]
    assert now(one, "m") == []  # a worker's own flows are its own to count
    assert now(two, "other-model") == []
    use.in_flight, use.waiting = 1, 0
    one.publish("m", "heavy", use)  # the same row, overwritten: never a count that drifts
    assert [(s.in_flight, s.waiting) for s in now(two, "m")] == [(1, 0)]
    one.forget("m", "heavy")
    assert now(two, "m") == []


def test_three_workers_each_read_the_other_two() -> None:
    _, (one, two, three) = host(3)
    one.publish("m", "heavy", Use(in_flight=2))
    two.publish("m", "heavy", Use(in_flight=5))
    two.publish("m", "light", Use(in_flight=1))
    got = sorted((s.flow, s.in_flight) for s in now(three, "m"))
    assert got == sorted([(flow_key("heavy"), 2), (flow_key("heavy"), 5), (flow_key("light"), 1)])
    assert sorted(s.in_flight for s in now(one, "m")) == [1, 5]


def test_a_dead_workers_counts_are_dropped_and_its_next_life_starts_from_nothing() -> None:
    tables, (one, two) = host()
    one.publish("m", "heavy", Use(in_flight=4, waiting=9))
    assert [s.in_flight for s in now(two, "m")] == [4]
    tables.journals.new_incarnation(1)  # the parent: worker 1 died
    assert now(two, "m") == []
    tables.journals.new_incarnation(1)  # ... and starts again
    reborn = HostFlows(tables, 1, 2.0, refresh=0.0)
    assert now(two, "m") == []  # its earlier life's row is still there, and counts for nothing
    reborn.publish("m", "light", Use(in_flight=1))
    assert [(s.flow, s.in_flight) for s in now(two, "m")] == [(flow_key("light"), 1)]


def test_a_row_read_half_written_is_skipped_and_read_again() -> None:
    tables, (one, two) = host()
    one.publish("m", "heavy", Use(in_flight=4))
    offset = tables.row(1, 0) + 8 * 4  # its in-flight word, changed under the check word
    struct.pack_into("=Q", tables.map, offset, 400)
    assert now(two, "m") == [] and two.torn >= 1
    struct.pack_into("=Q", tables.map, offset, 4)  # the writer finishes the row
    assert [s.in_flight for s in now(two, "m")] == [4]


def test_the_table_is_bounded_and_idle_rows_are_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_flows, "ROWS", 4)
    _, (one, two) = host()
    busy = Use(in_flight=1)
    for i in range(4):
        one.publish("m", f"id-{i}", busy)
    for i in range(4, 2000):  # hostile: an open router's client sending a new fairness id each time
        one.publish("m", f"id-{i}", busy)
    assert one.unpublished == 1996  # counted by worker 1 alone, never past the bound
    assert len(now(two, "m")) == 4
    idle = Use()
    idle.idle_since = time.monotonic() - 10.0
    one.publish("m", "id-0", idle)  # idle for 10 s: past the 2 s window, its row may go
    one.publish("m", "late", busy)
    assert sorted(s.flow for s in now(two, "m")) == sorted(
        flow_key(f) for f in ("id-1", "id-2", "id-3", "late")
    )


def test_priorities_and_weights_at_their_bounds_round_trip() -> None:
    _, (one, two) = host()
    one.publish("m", "low", Use(priority=-1000, weight=1000, in_flight=1))
    one.publish("m", "high", Use(priority=1000, weight=1, in_flight=1))
    assert sorted((s.priority, s.weight) for s in now(two, "m")) == [(-1000, 1000), (1000, 1)]


def test_a_worker_reads_its_siblings_at_most_every_refresh_whatever_the_request_rate() -> None:
    tables = HostFlowTables(WorkerJournals(2))
    one, two = HostFlows(tables, 1, 2.0), HostFlows(tables, 2, 2.0)
    assert two.siblings("m", 100.0) == ()
    one.publish("m", "heavy", Use(in_flight=4))
    assert two.siblings("m", 100.0 + host_flows.REFRESH_SECONDS / 2) == ()  # not read again yet
    assert [s.in_flight for s in two.siblings("m", 100.0 + 2 * host_flows.REFRESH_SECONDS)] == [4]
