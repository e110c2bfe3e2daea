"""The `corral status` screen: one row per engine from a `FleetView` — lifecycle state and since-when,
its pid and worker ranks from its supervisor, bundle fingerprint, in-flight and KV usage from the
engine's `/metrics`, adapters from its `/v1/models` — beside the router's membership view of it."""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table

from corral.engine import metric_names as m
from corral.engine_state import EngineState
from corral.fleet.checks.probe import EngineView, FleetView


def _since(epoch_seconds: object) -> str:
    if not isinstance(epoch_seconds, int | float):
        return "-"
    ago = max(0.0, time.time() - float(epoch_seconds))
    return f"{ago:.0f}s ago" if ago < 120 else f"{ago / 60:.0f}m ago"


def _sum(e: EngineView, metric: str) -> float | None:
    samples = e.metric(metric)
    return sum(s.value for s in samples) if samples else None


def in_flight(e: EngineView) -> str:
    running, waiting = _sum(e, m.RUNNING), _sum(e, m.WAITING)
    if running is None and waiting is None:
        return "-"
    return f"{running or 0:.0f} run / {waiting or 0:.0f} wait"


def kv_usage(e: EngineView) -> str:
    usage = _sum(e, m.KV_USAGE)
    if usage is None:
        usage = _sum(e, m.KV_USAGE_BEFORE_RENAME)
    return "-" if usage is None else f"{usage * 100:.0f}%"


def pid_cell(state: dict[str, Any]) -> str:
    """The engine's pid and its ranks: `4242, ranks 2/2`, or which rank is gone
    (`ranks 1/2: rank 1 (Worker_TP1 pid 4243) gone`) or not seen; just the pid where no rank is known."""
    text = str((state.get("engine") or {}).get("pid") or "-")
    ranks = [r for r in state.get("ranks") or [] if isinstance(r, dict)]
    if not ranks:
        return text
    world = state.get("world_size")
    alive = sum(1 for r in ranks if r.get("alive") is not False)
    text += f", ranks {alive}/{world if isinstance(world, int) else len(ranks)}"
    lost = [r for r in ranks if r.get("alive") is False]
    notes = [f"rank {r.get('rank')} ({r.get('name')} pid {r.get('pid')}) gone" for r in lost]
    if isinstance(world, int) and world > len(ranks):  # named by no log line (yet)
        notes.append(f"{world - len(ranks)} not seen")
    return f"{text}: {', '.join(notes)}" if notes else text


def bundle_cell(e: EngineView) -> str:
    """The bundle in effect (its name and fingerprint), and a start-failure strategy other than restart.
    Before READY, the fingerprint PRECHECK authorized or refused (the reason column says why)."""
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


def render_view(view: FleetView, title: str = "Corral fleet") -> Table:
    routed = {ep.url: ep for ep in view.router_endpoints or []}
    table = Table(title=title, title_justify="left")
    columns = ("engine", "state", "since", "reason", "restarts", "pid", "bundle", "in flight", "KV")
    for column in (*columns, "adapters", "router view"):
        table.add_column(column)
    for e in view.engines:
        if e.state is None and e.supervisor_url is not None:
            table.add_row(e.name, "[red]?[/red]", "-", e.state_error, *["-"] * 7)
            continue
        s = e.state or {}
        state = e.lifecycle if e.state is not None else ("answers" if e.health == 200 else "no answer")
        sub = s.get("sub_state")
        colour = (
            "green"
            if state == EngineState.READY
            else "red"
            if state in (EngineState.FAILED, "no answer")
            else "yellow"
        )
        ep = routed.get(str(e.engine_url))
        if ep is None:
            view_text = view.router_error or ("not listed" if view.router_endpoints is not None else "-")
        else:
            view_text = f"{ep.state}, {'routable' if ep.routable else 'not routable'}"
            view_text += f", in flight {ep.in_flight}"
        table.add_row(
            e.name,
            f"[{colour}]{state}[/{colour}]"
            + (f" ({sub})" if sub else "")
            + (" [sleeping]" if e.sleeping else ""),
            _since(s.get("since")),
            str(s.get("reason") or ""),
            str(len(s.get("restarts") or [])) if e.state is not None else "-",
            pid_cell(s),
            bundle_cell(e),
            in_flight(e),
            kv_usage(e),
            ", ".join(e.adapters) or "-",
            view_text,
        )
    return table
