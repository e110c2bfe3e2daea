"""The diagnosis tree on supervisor states the simulator cannot easily produce (rank failure, OOM,
loading, a dependency gate, a wrong model, a fingerprint mismatch)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from corral.fleet.checks.doctor import diagnose_engine
from corral.fleet.checks.probe import EngineView


def engine(state: dict[str, Any], health: int | None = 200, **extra: Any) -> EngineView:
    return EngineView("e0", "http://sup", "http://eng", state=state, health=health, **extra)


def branch(view: EngineView) -> str:
    return asyncio.run(diagnose_engine(view, 0.1)).branch


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (
            {
                "state": "STARTING",
                "sub_state": "waiting_dependencies",
                "reason": "waiting for 1 dependencies",
            },
            "not-ready/dependency",
        ),
        (
            {
                "state": "STARTING",
                "sub_state": "loading_model",
                "reason": "engine log: Starting to load model",
            },
            "not-ready/loading",
        ),
        (
            {
                "state": "FAILED",
                "reason": "engine exited with code 1 during startup (loading_model)",
                "evidence": {"last_lines": ["(Worker_TP1 pid=9) ERROR WorkerProc hit an exception"]},
            },
            "not-ready/rank-failure",
        ),
        (
            {
                "state": "FAILED",
                "reason": "engine not ready within --startup-timeout 5s (stuck in loading_model)",
            },
            "not-ready/loading-past-startup-budget",
        ),
        (
            {"state": "FAILED", "reason": "engine serves 'a', not the expected 'b'"},
            "requests-failing/stale-identity",
        ),
        (
            {"state": "FAILED", "reason": "engine stalled: 3 requests running and no token generated"},
            "requests-failing/hang",
        ),
        ({"state": "DRAINING", "sub_state": "waiting_in_flight", "reason": "drain"}, "not-ready/draining"),
        (
            {"state": "FAILED", "reason": "preload daemon keeps dying: 3 restarts spent (last: code -9)"},
            "preload/daemon-died",
        ),
        (
            {
                "state": "STARTING",
                "sub_state": "loading_model",
                "reason": "restarting the engine: preload daemon (pid 7) exited with code -9",
            },
            "preload/daemon-died",
        ),
    ],
)
def test_not_running_branches(state: dict[str, Any], expected: str) -> None:
    assert branch(engine(state)) == expected


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("oom", "memory/oom"),
        ("fingerprint", "preload/fingerprint-mismatch"),
        ("rank", "not-ready/rank-failure"),
        ("preload_exit", "preload/daemon-died"),
    ],
)
def test_evidence_branches_of_a_ready_engine(kind: str, expected: str) -> None:
    state = {"state": "READY", "reason": "ok", "engine_evidence": {kind: {"count": 1, "last": ["line"]}}}
    assert branch(engine(state, sleeping=False)) == expected


def test_a_ready_engine_that_does_not_answer_health_is_dead() -> None:
    assert branch(engine({"state": "READY", "reason": "ok"}, health=None)) == "process-dead/engine"


def test_an_unreachable_supervisor() -> None:
    view = EngineView("e0", "http://sup", None, state=None, state_error="supervisor unreachable")
    assert branch(view) == "process-dead/supervisor"


def _next(view: EngineView) -> str:
    return asyncio.run(diagnose_engine(view, 0.1)).next_command


def test_the_next_command_names_the_engine_as_the_user_knows_it_and_is_never_a_curl() -> None:
    crashed = {"state": "FAILED", "reason": "the engine was OOM-killed"}
    local = engine(crashed, local_port=8000)
    assert _next(local) == "corral logs --port 8000 --engine e0"
    remote = _next(engine(crashed))
    assert remote.startswith("corral status --supervisor http://sup --json")
    loading = {"state": "STARTING", "sub_state": "loading_model", "reason": "loading", "since": 1.0}
    assert "corral status --port 8000 --watch" in _next(engine(loading, local_port=8000))
    asleep = _next(engine({"state": "READY", "reason": "ok"}, sleeping=True, local_port=8000))
    assert asleep.startswith("corral wake --port 8000 --engine e0")
    for view in (local, engine(crashed), engine(loading), engine({"state": "READY"}, sleeping=True)):
        assert "curl" not in _next(view)


def test_an_operation_in_flight_is_named_at_its_step_with_a_corral_command_to_follow_it() -> None:
    draining = {
        "state": "DRAINING",
        "sub_state": "draining",
        "busy": "sleep nap",
        "operation": {
            "kind": "sleep",
            "id": "nap",
            "detail": "level 1",
            "step": "drain_policy",
            "since": 1.0,
        },
    }
    found = asyncio.run(diagnose_engine(engine(draining, local_port=8000), 0.1))
    assert found.branch == "not-ready/operation-in-flight"
    assert found.evidence.startswith("an operation is in flight: sleep (level 1) at DRAIN since "), found
    assert found.next_command == "wait, or follow it with `corral status --port 8000 --watch`"
    # asleep at VERIFY is the operation's passing state, not a sleep to wake from
    verifying = {**draining, "state": "SLEEPING", "operation": {**draining["operation"], "step": "verify"}}
    assert branch(engine(verifying, sleeping=True)) == "not-ready/operation-in-flight"
    # an older supervisor (no `operation`) is read as before
    assert branch(engine({k: v for k, v in draining.items() if k != "operation"})) == "not-ready/draining"
    # a FAILED engine is diagnosed as FAILED even while an operation recovers it
    assert branch(engine({**draining, "state": "FAILED", "reason": "x"})) == "process-dead/failed"
