"""A shutdown (SIGTERM, prestop) while the engine is withdrawn for not answering (DRAINING/not_answering):
routers left it already and it answers nothing, so the drain stops it at once and says why."""

from __future__ import annotations

from typing import Any

from corral.supervisor.lifecycle.drain import DrainPolicy, DrainSequence
from corral.supervisor.lifecycle.states import DrainPhase, EngineState
from tests.unit.test_supervisor_drain_sequence import engine, host

__all__ = ["engine"]  # the fixture, used by name


async def test_a_drain_of_an_engine_withdrawn_for_silence_stops_it_without_waiting(
    engine: dict[str, Any],
) -> None:
    h = host(engine)
    h.machine.transition(EngineState.DRAINING, "engine not answering", DrainPhase.NOT_ANSWERING)
    report = await DrainSequence(h, lambda line: None).drain_and_stop(DrainPolicy.WAIT)
    assert h.steps()[-2:] == [("STOPPING", "stopping_engine"), ("STOPPING", "engine_stopped")]
    assert h.suspended == 1 and h.stops == [(h.drain_settings.shutdown_timeout, "drain")]
    assert report.removal_epoch is None and report.routers_acknowledged == []
    assert report.notes == ["drain in DRAINING/not_answering: routers had left; the engine answers nothing"]
