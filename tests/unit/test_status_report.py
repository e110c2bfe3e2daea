"""`corral status` in words: lifecycle states without internals, the exit-code verdict (a planned sleep
is settled), the compact layout within 80 columns with long names whole, and the JSON shape."""

from __future__ import annotations

from typing import Any

import pytest

from corral.contracts.router import FleetEndpoint
from corral.fleet.checks.probe import EngineView, FleetTarget, FleetView
from corral.fleet.checks.status_report import SCHEMA, Verdict, fleet_verdict, state_words, status_json
from corral.fleet.checks.status_table import full_width, render_compact

LONG = "engine-with-a-rather-long-name-that-must-never-be-cut-0"


def engine(state: dict[str, Any] | None, name: str = "engine-0", **extra: Any) -> EngineView:
    return EngineView(
        name, "http://127.0.0.1:41001", "http://127.0.0.1:41002", state=state, health=200, **extra
    )


def view(*engines: EngineView, router_error: str = "") -> FleetView:
    target = FleetTarget(
        "http://127.0.0.1:8000", [(e.name, str(e.supervisor_url)) for e in engines], port=8000
    )
    endpoints = [FleetEndpoint(url=str(e.engine_url), state="READY", routable=True) for e in engines]
    return FleetView(target, list(engines), endpoints if not router_error else None, router_error)


@pytest.mark.parametrize(
    ("state", "words"),
    [
        ({"state": "READY", "sub_state": None}, "READY"),
        ({"state": "SLEEPING", "sub_state": "level_1"}, "SLEEPING (level 1)"),
        ({"state": "FAILED", "sub_state": "gave_up"}, "FAILED (gave up)"),
        (
            {"state": "DRAINING", "sub_state": "leaving_routing", "busy": "sleep"},
            "DRAINING (leaving routing, sleep running)",
        ),
        (None, "UNREACHABLE (no supervisor answer)"),
    ],
)
def test_states_in_words(state: dict[str, Any] | None, words: str) -> None:
    assert state_words(engine(state)) == words


@pytest.mark.parametrize(
    ("states", "verdict"),
    [
        (["READY", "READY"], Verdict.SETTLED),
        (["READY", "SLEEPING"], Verdict.SETTLED),  # a runbook sleep is not a failure
        (["READY", "STARTING"], Verdict.MOVING),
        (["SLEEPING", "WAKING"], Verdict.MOVING),
        (["READY", "FAILED"], Verdict.WRONG),
        (["STARTING", "FAILED"], Verdict.WRONG),
    ],
)
def test_the_exit_code_verdict(states: list[str], verdict: Verdict) -> None:
    fleet = view(*(engine({"state": s}, f"engine-{i}") for i, s in enumerate(states)))
    assert fleet_verdict(fleet) is verdict
    assert status_json(fleet)["exit_code"] == int(verdict)


def test_a_router_that_does_not_answer_is_wrong() -> None:
    assert (
        fleet_verdict(view(engine({"state": "READY"}), router_error="router: unreachable")) is Verdict.WRONG
    )


def test_compact_fits_80_columns_and_never_cuts_a_name() -> None:
    reason = "engine exited with code 1 during startup (loading_model); " * 3
    fleet = view(
        engine({"state": "FAILED", "sub_state": "gave_up", "reason": reason}, LONG),
        engine({"state": "READY"}),
    )
    text = render_compact(fleet, 80)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert LONG in text and "supervisor http://127.0.0.1:41001" in text and "…" not in text
    assert "None" not in text
    assert full_width(fleet) > 80  # the full table would not fit: auto picks compact there


def test_json_shape() -> None:
    body = status_json(view(engine({"state": "READY", "bundle_name": "initial"})))
    assert body["schema"] == SCHEMA and body["verdict"] == "settled" and body["router"]["error"] is None
    (one,) = body["engines"]
    expected = {
        "name",
        "supervisor",
        "engine",
        "state",
        "sub_state",
        "state_text",
        "verdict",
        "since",
        "reason",
    }
    assert expected <= set(one) and {
        "bundle",
        "in_flight",
        "kv_usage",
        "adapters",
        "router",
        "last_lines",
    } <= set(one)
    assert one["router"]["routable"] is True and one["bundle"]["name"] == "initial"
