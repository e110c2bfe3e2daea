"""The flow queue's order (corral.router.flow.queue): bands highest first, weighted fair shares among a
band's flows, FCFS or earliest deadline within a flow, lazy removal, expiry by band TTL."""

from __future__ import annotations

import math
from collections import Counter

from corral.router.flow.queue import FlowQueue, Queued


def item(
    flow: str,
    priority: int = 0,
    weight: int = 1,
    at: float = 0.0,
    ttl: float = 30.0,
    deadline: float = math.inf,
) -> Queued:
    return Queued(
        priority=priority, flow=flow, weight=weight, enqueued=at, expires=at + ttl, deadline=deadline
    )


def drain(queue: FlowQueue, n: int | None = None) -> list[Queued]:
    out: list[Queued] = []
    while (n is None or len(out) < n) and (got := queue.pop()) is not None:
        out.append(got)
    return out


def test_a_flood_does_not_delay_a_light_flow_behind_it() -> None:
    queue = FlowQueue()
    for i in range(100):
        queue.push(item("heavy", at=i))
    light = item("light", at=100)
    queue.push(light)
    # the light flow joins at the band's virtual time: it goes within the next two, not after 100
    assert light in drain(queue, 2)


def test_shares_follow_weights_while_both_wait() -> None:
    queue = FlowQueue()
    for i in range(300):
        queue.push(item("a", weight=3, at=i))
        queue.push(item("b", weight=1, at=i))
    first = Counter(q.flow for q in drain(queue, 200))
    assert first["a"] == 150 and first["b"] == 50


def test_higher_band_first_and_fcfs_within_a_flow() -> None:
    queue = FlowQueue()
    low = [item("t", priority=0, at=i) for i in range(3)]
    high = [item("u", priority=10, at=10 + i) for i in range(2)]
    for q in [*low, *high]:
        queue.push(q)
    assert drain(queue) == [*high, *low]


def test_earliest_deadline_first_within_a_flow() -> None:
    queue = FlowQueue(order="edf")
    late, none, soon = item("t", deadline=5.0), item("t"), item("t", deadline=1.0)
    for q in (late, none, soon):
        queue.push(q)
    assert drain(queue) == [soon, late, none]


def test_removed_requests_are_skipped_and_counted_off_at_once() -> None:
    queue = FlowQueue()
    a, b, c = item("t"), item("t"), item("u")
    for q in (a, b, c):
        queue.push(q)
    assert queue.remove(b)
    assert not queue.remove(b)  # once only
    assert len(queue) == 2 and queue.depths() == {(0, "t"): 1, (0, "u"): 1}
    assert set(drain(queue)) == {a, c}
    assert len(queue) == 0 and queue.depths() == {}


def test_a_flow_whose_requests_all_left_loses_its_turn_not_the_queue() -> None:
    queue = FlowQueue()
    gone = item("t")
    queue.push(gone)
    stays = item("u")
    queue.push(stays)
    queue.remove(gone)
    assert drain(queue) == [stays]


def test_expiry_by_band_oldest_first() -> None:
    queue = FlowQueue()
    old, young = item("t", at=0.0, ttl=1.0), item("t", at=5.0, ttl=1.0)
    other_band = item("t", priority=5, at=0.0, ttl=100.0)
    for q in (old, young, other_band):
        queue.push(q)
    assert list(queue.expired(2.0)) == [old]
    queue.remove(old)
    assert list(queue.expired(2.0)) == []
    assert queue.oldest() is other_band


def test_lowest_is_the_newest_of_the_lowest_band() -> None:
    queue = FlowQueue()
    a, b, c = item("t", priority=0, at=0), item("t", priority=0, at=1), item("t", priority=3, at=2)
    for q in (a, b, c):
        queue.push(q)
    assert queue.lowest() is b
