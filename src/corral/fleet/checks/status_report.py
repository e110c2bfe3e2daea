"""What `corral status` says about a `FleetView`, in words and as `--json` (shape `corral.status/v1`),
and the verdict its exit code carries: settled (every engine READY, or asleep by a runbook sleep), moving
(starting, draining, waking, an operation running), or wrong (FAILED, unreachable, router not answering)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from corral.engine import metric_names as m
from corral.engine_state import EngineState
from corral.fleet.checks.operation_words import operation_in_flight, operation_words, step_name
from corral.fleet.checks.probe import EngineView, FleetView

SCHEMA = "corral.status/v1"
_SETTLED = frozenset({EngineState.READY, EngineState.SLEEPING})
_MOVING = frozenset({EngineState.STARTING, EngineState.DRAINING, EngineState.WAKING, EngineState.PAUSED})


class Verdict(IntEnum):
    """`corral status`'s exit code."""

    SETTLED = 0  # every engine READY, or SLEEPING because a runbook sleep put it there; router answering
    WRONG = 1  # an engine FAILED, STOPPING or unreachable, or the router not answering
    MOVING = 3  # nothing wrong, but an engine is starting, draining, waking or paused by an operation


def _sum(e: EngineView, metric: str) -> float | None:
    samples = e.metric(metric)
    return sum(s.value for s in samples) if samples else None


def in_flight(e: EngineView) -> str:
    running, waiting = _sum(e, m.RUNNING), _sum(e, m.WAITING)
    if running is None and waiting is None:
        return "-"
    return f"{running or 0:.0f} run / {waiting or 0:.0f} wait"


def kv_fraction(e: EngineView) -> float | None:
    usage = _sum(e, m.KV_USAGE)
    return _sum(e, m.KV_USAGE_BEFORE_RENAME) if usage is None else usage


def kv_usage(e: EngineView) -> str:
    usage = kv_fraction(e)
    return "-" if usage is None else f"{usage * 100:.0f}%"


def since(epoch_seconds: object, now: float | None = None) -> str:
    if not isinstance(epoch_seconds, int | float):
        return "-"
    ago = max(0.0, (now or time.time()) - float(epoch_seconds))
    return (
        f"{ago:.0f}s ago" if ago < 120 else f"{ago / 60:.0f}m ago" if ago < 7200 else f"{ago / 3600:.0f}h ago"
    )


def words(identifier: object) -> str:
    """A sub-state or verdict as words (`gave_up` -> `gave up`)."""
    return str(identifier).replace("_", " ")


def state_words(e: EngineView) -> str:
    """The engine's lifecycle state as a person reads it: `READY`, `SLEEPING (level 1)`,
    `FAILED (gave up)`, `DRAINING (draining, sleep (level 1) at DRAIN for 4 s)` (an operation at its
    runbook step; `sleep running` from a supervisor that does not say the step),
    `UNREACHABLE (no supervisor answer)`; never an empty sub-state."""
    s = e.state
    if s is None:
        if e.supervisor_url is not None:
            return f"UNREACHABLE ({e.state_error or 'no supervisor answer'})"
        return "answers (no supervisor)" if e.health == 200 else "UNREACHABLE (engine not answering)"
    state, sub = str(s.get("state") or "UNKNOWN"), s.get("sub_state")
    details = [words(sub)] if sub else []
    if (op := operation_in_flight(s)) is not None:
        details.append(operation_words(op))
    elif s.get("busy"):
        details.append(f"{words(s['busy'])} running")
    if e.sleeping and state != EngineState.SLEEPING:
        details.append("engine says it is asleep")
    return f"{state} ({', '.join(details)})" if details else state


def verdict_of(e: EngineView) -> Verdict:
    if e.supervisor_url is None:
        return Verdict.SETTLED if e.health == 200 else Verdict.WRONG
    if e.state is None:
        return Verdict.WRONG
    state = e.lifecycle
    if state in _SETTLED and not e.state.get("busy") and operation_in_flight(e.state) is None:
        return Verdict.SETTLED
    return Verdict.MOVING if state in _MOVING or state in _SETTLED else Verdict.WRONG


def fleet_verdict(view: FleetView) -> Verdict:
    verdicts = [verdict_of(e) for e in view.engines]
    if view.router_error or Verdict.WRONG in verdicts:
        return Verdict.WRONG
    return Verdict.MOVING if Verdict.MOVING in verdicts else Verdict.SETTLED


@dataclass(frozen=True)
class RouterSeen:
    """How the router routes one engine, in words."""

    text: str
    body: dict[str, Any] | None


def router_seen(view: FleetView, e: EngineView) -> RouterSeen:
    routed = {ep.url: ep for ep in view.router_endpoints or []}
    ep = routed.get(str(e.engine_url))
    if ep is None:
        text = "router not answering" if view.router_error else "not listed by the router"
        return RouterSeen(text if view.router_endpoints is not None or view.router_error else "-", None)
    body = {"state": str(ep.state), "routable": ep.routable, "in_flight": ep.in_flight, "why": ep.why}
    return RouterSeen(f"{ep.state}, {'routable' if ep.routable else 'not routable'}", body)


def bundle_cell(e: EngineView) -> str:
    """The bundle in effect (its name and fingerprint), and a start-failure strategy other than restart.
    Before READY, the fingerprint PRECHECK authorized or refused (the reason says why)."""
    s = e.state or {}
    name, strategy = s.get("bundle_name"), s.get("on_startup_failure")
    text = e.fingerprint or "-"
    precheck = s.get("precheck")
    if e.fingerprint is None and isinstance(precheck, dict) and precheck.get("fingerprint"):
        text = f"{precheck['fingerprint']} (PRECHECK {precheck.get('outcome')})"
    if name:
        text = f"{name} {text}"
    if strategy and strategy != "restart":
        text += f" [on start failure: {strategy}]"
    return text


def _operation_json(state: dict[str, Any]) -> dict[str, Any] | None:
    op = operation_in_flight(state)
    if op is None:
        return None
    return {**op.to_wire(), "step_name": step_name(op.step), "text": operation_words(op)}


def engine_json(view: FleetView, e: EngineView) -> dict[str, Any]:
    s = e.state or {}
    running, waiting = _sum(e, m.RUNNING), _sum(e, m.WAITING)
    return {
        "name": e.name,
        "supervisor": e.supervisor_url,
        "engine": e.engine_url,
        "state": s.get("state") if e.state is not None else None,
        "sub_state": s.get("sub_state"),
        "state_text": state_words(e),
        "verdict": verdict_of(e).name.lower(),
        "since": s.get("since"),
        "reason": s.get("reason") or e.state_error or "",
        "operation": s.get("busy"),
        # kind, id, detail, step (a runbook step's value: drain_policy), since (the supervisor's clock, when
        # the step began), step_name (DRAIN), text; null when none runs or the supervisor predates issue 18
        "operation_in_flight": _operation_json(s),
        "restarts": len(s.get("restarts") or []),
        "last_lines": [str(line) for line in (s.get("evidence") or {}).get("last_lines") or []],
        "pid": (s.get("engine") or {}).get("pid"),
        "bundle": {"name": s.get("bundle_name"), "fingerprint": e.fingerprint, "text": bundle_cell(e)},
        "in_flight": None
        if running is None and waiting is None
        else {"running": running, "waiting": waiting},
        "kv_usage": kv_fraction(e),
        "adapters": e.adapters,
        "sleeping": e.sleeping,
        "router": router_seen(view, e).body,
    }


def status_json(view: FleetView) -> dict[str, Any]:
    """`corral status --json`: stable keys, documented in docs/operations.md ("CLI")."""
    verdict = fleet_verdict(view)
    return {
        "schema": SCHEMA,
        "verdict": verdict.name.lower(),
        "exit_code": int(verdict),
        "router": {"url": view.target.router, "error": view.router_error or None},
        "engines": [engine_json(view, e) for e in view.engines],
    }
