"""The supervisor's acknowledgement bookkeeping: a drain's leave-routing step waits for every
subscribed router's acknowledgement of the removal epoch (a later epoch counts, an earlier one does
not), a router whose stream closes is counted as gone rather than awaited, and the propagation
deadline bounds the wait. Engine metrics are replaced by a steady sample (no request arriving)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from corral.engine.load_sample import LoadSample
from corral.engine_state import EngineState
from corral.supervisor.lifecycle.drain import Drainer, DrainReport, DrainSettings
from corral.supervisor.lifecycle.routers import RouterSubscriptions
from corral.supervisor.lifecycle.states import StateEvent
from tests.support.waits import eventually

EPOCH = 5


class Journal:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.lines: list[str] = []

    def record(self, record_type: str, /, **fields: Any) -> dict[str, Any]:
        entry = {"record": record_type, **fields}
        self.records.append(entry)
        return entry

    def kinds(self) -> list[str]:
        return [r["record"] for r in self.records]


class QuietEngine(Drainer):
    """A Drainer whose engine never sees a new request; `samples` counts its rounds (each reads the
    acknowledgements first), so a test can wait until the drainer has looked again."""

    samples = 0

    async def _sample(self) -> LoadSample | None:
        self.samples += 1
        return LoadSample(running=1, waiting=0, finished=10, generation_tokens=0, at=time.monotonic())


def drainer(routers: RouterSubscriptions, propagation: float = 5.0) -> QuietEngine:
    settings = DrainSettings(propagation_timeout=propagation, quiet_period=0.05, poll_seconds=0.02)
    return QuietEngine(None, "http://engine", settings, lambda m: None, routers)  # type: ignore[arg-type]


@pytest.fixture
def journal() -> Journal:
    return Journal()


def subscriptions(journal: Journal) -> RouterSubscriptions:
    return RouterSubscriptions(journal.record, journal.lines.append)


async def test_drain_waits_for_every_subscribed_router(journal: Journal) -> None:
    routers = subscriptions(journal)
    routers.subscribe("a")
    routers.subscribe("b")
    report = DrainReport(policy="wait")
    engine = drainer(routers, propagation=3600)
    leaving = asyncio.create_task(engine.leave_routing(report, EPOCH))
    await eventually(lambda: report.quiet_reached, "the quiet period reached")
    quiet_seen = time.monotonic()  # the drain began before this
    assert not leaving.done()  # quiet long since: only the acknowledgements are missing
    routers.acknowledge("a", EPOCH)
    rounds = engine.samples
    await eventually(lambda: engine.samples >= rounds + 2, "the drainer looked again after a's ack")
    assert not leaving.done()
    b_acked = time.monotonic()
    routers.acknowledge("b", EPOCH + 1)  # a later epoch (joined mid-drain) counts too
    await asyncio.wait_for(leaving, 30)
    assert {a["router_id"] for a in report.routers_acknowledged} == {"a", "b"}
    assert report.routers_missing == [] and report.routers_gone == []
    # measured to the last acknowledgement (b's), from a start before `quiet_seen`
    assert report.acknowledged_after_s is not None
    assert report.acknowledged_after_s >= b_acked - quiet_seen
    assert report.quiet_reached


async def test_an_acknowledgement_of_an_earlier_epoch_does_not_count(journal: Journal) -> None:
    routers = subscriptions(journal)
    routers.subscribe("a")
    routers.acknowledge("a", EPOCH - 1)  # e.g. its first line was an older STARTING epoch
    report = DrainReport(policy="wait")
    await drainer(routers, propagation=0.3).leave_routing(report, EPOCH)
    assert report.routers_missing == ["a"] and report.routers_acknowledged == []


async def test_a_router_that_disconnects_is_counted_gone_not_awaited(journal: Journal) -> None:
    routers = subscriptions(journal)
    routers.subscribe("a")
    routers.subscribe("b")
    report = DrainReport(policy="wait")
    engine = drainer(routers, propagation=3600)  # ending at all means b was not awaited
    leaving = asyncio.create_task(engine.leave_routing(report, EPOCH))
    routers.acknowledge("a", EPOCH)
    await eventually(lambda: engine.samples >= 2, "the drainer waiting on b")
    assert not leaving.done()
    routers.unsubscribe("b")
    await asyncio.wait_for(leaving, 30)
    assert report.routers_gone == ["b"] and report.routers_missing == []
    gone = [r for r in journal.records if r["record"] == "router_unsubscribed"]
    assert gone == [{"record": "router_unsubscribed", "router_id": "b", "awaited_epoch": EPOCH}]
    assert any("counted as gone" in line for line in journal.lines)


async def test_a_router_with_two_streams_stays_subscribed_until_both_close(journal: Journal) -> None:
    routers = subscriptions(journal)
    routers.subscribe("a")
    routers.subscribe("a")  # a reconnect that overlaps the old stream
    routers.unsubscribe("a")
    assert routers.subscribed() == ["a"] and routers.missing(EPOCH) == ["a"]
    routers.unsubscribe("a")
    assert routers.subscribed() == []
    assert journal.kinds() == ["router_subscribed", "router_unsubscribed"]


async def test_the_propagation_deadline_bounds_the_wait(journal: Journal) -> None:
    routers = subscriptions(journal)
    routers.subscribe("silent")
    report = DrainReport(policy="wait")
    # without the deadline this would wait for the silent router for ever (wait_for would fail it)
    await asyncio.wait_for(drainer(routers, propagation=0.4).leave_routing(report, EPOCH), 30)
    assert report.propagation_seconds >= 0.4  # it ended by the deadline, not before it
    assert report.routers_missing == ["silent"] and report.acknowledged_after_s is None


async def test_without_subscribers_only_the_quiet_period_is_waited_for(journal: Journal) -> None:
    routers = subscriptions(journal)
    report = DrainReport(policy="wait")
    await asyncio.wait_for(drainer(routers, propagation=3600).leave_routing(report, EPOCH), 30)
    assert report.quiet_reached and report.acknowledged_after_s is not None
    assert report.routers_acknowledged == [] and report.routers_missing == []


def test_each_acknowledgement_is_logged_with_its_latency_from_the_event(journal: Journal) -> None:
    now = [1000.0]
    routers = RouterSubscriptions(journal.record, journal.lines.append, clock=lambda: now[0])
    routers.note_event(
        StateEvent(EPOCH, EngineState.READY, EngineState.DRAINING, "leaving_routing", "drain", 999.9)
    )
    routers.subscribe("a")
    routers.acknowledge("a", EPOCH, state="DRAINING", removal_latency_s=0.0004)
    (ack,) = [r for r in journal.records if r["record"] == "ack"]
    assert ack["router_id"] == "a" and ack["epoch"] == EPOCH and ack["subscribed"] is True
    assert ack["latency_s"] == pytest.approx(0.1) and ack["removal_latency_s"] == 0.0004
    assert routers.to_json()["acks"]["a"]["epoch"] == EPOCH
