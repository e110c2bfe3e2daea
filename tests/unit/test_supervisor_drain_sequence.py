"""The one drain sequence (lifecycle/drain.py) against a real HTTP /metrics endpoint: which transitions
it makes on the state machine itself, in which order, and that only shutdown stops the engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from corral.engine.metric_names import FINISHED, RUNNING, WAITING
from corral.supervisor.lifecycle.drain import DrainPolicy, DrainSequence, DrainSettings
from corral.supervisor.lifecycle.routers import RouterSubscriptions
from corral.supervisor.lifecycle.states import EngineState, StateEvent, StateMachine

S = EngineState


class Host:
    """A supervisor as the drain sees it: a real state machine, an engine answering /metrics."""

    def __init__(self, session: aiohttp.ClientSession, url: str, state: EngineState) -> None:
        self.machine = StateMachine(initial=state, sub_state=None)
        self.events: list[StateEvent] = []
        self.machine.subscribe(self.events.append)
        self.routers = RouterSubscriptions(lambda kind, **fields: {}, lambda line: None)
        self.session = session
        self.engine_url = url
        self.drain_settings = DrainSettings(propagation_timeout=2.0, quiet_period=0.05, poll_seconds=0.02)
        self.engine_running = True
        self.request_watch = None  # no admission gate (tests/unit/test_forced_exits.py has one)
        self.suspended = 0
        self.stops: list[tuple[float, str]] = []

    async def suspend_lifecycle(self) -> None:
        self.suspended += 1

    async def stop_engine(self, grace: float, reason: str) -> int | None:
        self.stops.append((grace, reason))
        self.engine_running = False
        return 0

    def steps(self) -> list[tuple[str, str | None]]:
        """Transitions the sequence made (subscribing replays the machine's current state first)."""
        return [(str(e.to_state), e.sub_state) for e in self.events[1:]]


@pytest.fixture
async def engine() -> AsyncIterator[dict[str, Any]]:
    figures = {"running": 0}

    async def metrics(request: web.Request) -> web.Response:
        text = f"{RUNNING} {figures['running']}\n{WAITING} 0\n{FINISHED} 5\n"
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield {"figures": figures, "session": session, "url": str(server.make_url("")).rstrip("/")}
    await server.close()


def host(engine: dict[str, Any], state: EngineState = S.READY) -> Host:
    return Host(engine["session"], engine["url"], state)


async def test_shutdown_runs_every_step_and_transitions_itself(engine: dict[str, Any]) -> None:
    h = host(engine)
    report = await DrainSequence(h, lambda line: None).drain_and_stop(DrainPolicy.WAIT)
    assert h.steps() == [
        ("DRAINING", "leaving_routing"),
        ("DRAINING", "waiting_in_flight"),
        ("STOPPING", "stopping_engine"),
        ("STOPPING", "engine_stopped"),
    ]
    assert h.suspended == 1
    assert h.stops == [(h.drain_settings.shutdown_timeout, "drain")]
    assert report.quiet_reached and report.in_flight_drained
    assert report.engine_exit_code == 0
    assert report.removal_epoch == h.events[1].epoch


async def test_abort_skips_the_wait(engine: dict[str, Any]) -> None:
    engine["figures"]["running"] = 3
    h = host(engine)
    report = await DrainSequence(h, lambda line: None).drain_and_stop(DrainPolicy.ABORT)
    assert [sub for _, sub in h.steps()] == [
        "leaving_routing",
        "aborting",
        "stopping_engine",
        "engine_stopped",
    ]
    assert not report.in_flight_drained
    assert report.at_stop is not None and report.at_stop["running"] == 3
    assert report.cut_short is not None and "3 running" in report.cut_short


async def test_an_operation_leaves_routing_and_applies_the_policy_without_stopping(
    engine: dict[str, Any],
) -> None:
    h = host(engine)
    sequence = DrainSequence(h, lambda line: None)
    leaving = await sequence.leave("sleep: readiness withdrawn", "wait")
    evidence = await sequence.apply_policy(leaving, "wait")
    assert h.steps() == [("DRAINING", "leaving_routing"), ("DRAINING", "waiting_in_flight")]
    assert h.stops == []
    assert evidence["in_flight_drained"] is True
    assert leaving.evidence()["removal_epoch"] == h.events[1].epoch
    assert leaving.evidence()["quiet_reached"] is True


async def test_keep_freezes_in_flight_requests_without_a_transition(engine: dict[str, Any]) -> None:
    engine["figures"]["running"] = 2
    h = host(engine)
    sequence = DrainSequence(h, lambda line: None)
    leaving = await sequence.leave("sleep: readiness withdrawn", "keep")
    evidence = await sequence.apply_policy(leaving, "keep")
    assert h.steps() == [("DRAINING", "leaving_routing")]
    assert evidence["in_flight_frozen"] == 2


async def test_a_drain_before_ready_stops_the_engine_without_leaving_routing(engine: dict[str, Any]) -> None:
    h = host(engine, S.STARTING)
    report = await DrainSequence(h, lambda line: None).drain_and_stop(DrainPolicy.WAIT)
    assert h.steps() == [("STOPPING", "stopping_engine"), ("STOPPING", "engine_stopped")]
    assert h.suspended == 1
    assert h.stops == [(h.drain_settings.shutdown_timeout, "drain")]
    assert report.removal_epoch is None
    assert report.notes == ["drain in STARTING: nothing was routed here"]
