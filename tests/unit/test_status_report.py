"""`corral status` in words: lifecycle states without internals, the exit-code verdict (a planned sleep
is settled), the compact layout within 80 columns with long names whole, and the JSON shape."""

from __future__ import annotations

import re
from typing import Any

import pytest
from rich.console import Console

from corral.contracts.router import FleetEndpoint
from corral.fleet.checks.probe import EngineView, FleetTarget, FleetView
from corral.fleet.checks.status_report import SCHEMA, Verdict, fleet_verdict, state_words, status_json
from corral.fleet.checks.status_table import full_width, render_compact, render_full

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


def test_an_operation_is_shown_at_its_runbook_step_in_words_layouts_and_json() -> None:
    import time

    op = {"kind": "sleep", "id": "nap", "detail": "level 1", "step": "drain_policy", "since": time.time() - 4}
    draining = {"state": "DRAINING", "sub_state": "draining", "busy": "sleep nap", "operation": op}
    fleet = view(engine(draining, LONG))
    assert re.fullmatch(
        r"DRAINING \(draining, sleep \(level 1\) at DRAIN for \d+ s\)", state_words(fleet.engines[0])
    )
    assert fleet_verdict(fleet) is Verdict.MOVING
    text = render_compact(fleet, 80)
    assert "sleep (level 1) at DRAIN" in text.replace("\n    ", " ") and all(
        len(li) <= 80 for li in text.splitlines()
    )
    wide = Console(width=full_width(fleet), record=True)
    wide.print(render_full(fleet))
    assert "sleep (level 1) at DRAIN for" in wide.export_text()  # the full table's state cell
    (one,) = status_json(fleet)["engines"]
    assert one["operation"] == "sleep nap"  # the holder, as before
    shown = one["operation_in_flight"]
    assert {k: shown[k] for k in ("kind", "id", "detail", "step", "since")} == op
    assert shown["step_name"] == "DRAIN" and shown["text"].startswith("sleep (level 1) at DRAIN for ")
    # PRECHECK on a sleeping engine (a wake) is moving too, and an older supervisor reads as none
    waking = {
        "state": "SLEEPING",
        "sub_state": "level_1",
        "operation": {**op, "kind": "wake", "step": "precheck"},
    }
    assert fleet_verdict(view(engine(waking))) is Verdict.MOVING
    old = view(engine({"state": "DRAINING", "busy": "sleep nap"}))
    assert status_json(old)["engines"][0]["operation_in_flight"] is None
    assert state_words(old.engines[0]) == "DRAINING (sleep nap running)"
    bad = view(engine({"state": "READY", "operation": {"kind": "sleep"}}))  # no step: not read
    assert (
        fleet_verdict(bad) is Verdict.SETTLED
        and status_json(bad)["engines"][0]["operation_in_flight"] is None
    )
