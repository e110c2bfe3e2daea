"""The `corral status` screen, in two layouts of the same words (`status_report`): `full`, one table
row per engine for a wide terminal, and `compact`, a few lines per engine that fit 80 columns (a
narrow terminal, a pipe, a file); names and URLs are never cut short in either."""

from __future__ import annotations

import textwrap
from typing import Any

from rich import box
from rich.table import Table

from corral.fleet.checks.probe import EngineView, FleetView
from corral.fleet.checks.status_report import (
    Verdict,
    bundle_cell,
    fleet_verdict,
    in_flight,
    kv_usage,
    router_seen,
    since,
    state_words,
    verdict_of,
)

FULL_MIN_WIDTH = 140  # below it the compact layout is used (and whenever the full table would not fit)
_HEADLINE = {
    Verdict.SETTLED: "all serving or asleep by plan",
    Verdict.MOVING: "changing state",
    Verdict.WRONG: "something is wrong",
}
_COLOUR = {Verdict.SETTLED: "green", Verdict.MOVING: "yellow", Verdict.WRONG: "red"}

__all__ = ["bundle_cell", "in_flight", "kv_usage", "pid_cell", "render_compact", "render_full"]


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


def headline(view: FleetView, title: str) -> str:
    verdict = fleet_verdict(view)
    router = view.target.router or "no router"
    count = f"{len(view.engines)} engine{'s' if len(view.engines) != 1 else ''}"
    return f"{title} (router {router}): {count}, {_HEADLINE[verdict]}"


def _reason(e: EngineView) -> str:
    return str((e.state or {}).get("reason") or e.state_error or "")


def _restarts(e: EngineView) -> str:
    return str(len((e.state or {}).get("restarts") or [])) if e.state is not None else "-"


_FULL_COLUMNS = ("engine", "state", "since", "supervisor", "bundle", "in flight", "KV", "adapters", "router")
_REASON_MIN = 30


def _full_rows(view: FleetView) -> list[tuple[str, ...]]:
    return [
        (
            e.name,
            state_words(e),
            since((e.state or {}).get("since")),
            e.supervisor_url or "-",
            bundle_cell(e),
            in_flight(e),
            kv_usage(e),
            ", ".join(e.adapters) or "-",
            router_seen(view, e).text,
            _reason(e),
        )
        for e in view.engines
    ]


def full_width(view: FleetView) -> int:
    """The columns the full table needs to cut no name or URL short and leave reasons room."""
    rows = _full_rows(view)
    widths = [max([len(header), *(len(row[i]) for row in rows)]) for i, header in enumerate(_FULL_COLUMNS)]
    return sum(widths) + _REASON_MIN + 3 * (len(_FULL_COLUMNS) + 1)


def render_full(view: FleetView, title: str = "Corral fleet") -> Table:
    """One row per engine; for a terminal that holds `full_width` (restarts and pid: compact, JSON)."""
    table = Table(title=headline(view, title), title_justify="left", box=box.SIMPLE_HEAD)
    for column in _FULL_COLUMNS:
        table.add_column(column, no_wrap=True)
    table.add_column("reason", overflow="fold", ratio=1, min_width=_REASON_MIN)
    for e, row in zip(view.engines, _full_rows(view), strict=True):
        colour = _COLOUR[verdict_of(e)]
        table.add_row(row[0], f"[{colour}]{row[1]}[/{colour}]", *row[2:])
    if view.router_error:
        table.caption = f"router: {view.router_error}"
    return table


def render_compact(view: FleetView, width: int = 80, title: str = "Corral fleet") -> str:
    """A few lines per engine, each wrapped to `width` (never a name cut short)."""
    out: list[str] = []

    def line(text: str, indent: str = "") -> None:
        out.extend(
            textwrap.wrap(
                text,
                width=max(40, width),
                initial_indent=indent,
                subsequent_indent=indent + "    ",
                break_long_words=False,
                break_on_hyphens=False,
            )
            or [indent]
        )

    line(headline(view, title))
    if view.router_error:
        line(f"router: {view.router_error}", "  ")
    for e in view.engines:
        s = e.state or {}
        line(f"{e.name}  {state_words(e)}  since {since(s.get('since'))}  restarts {_restarts(e)}")
        line(f"supervisor {e.supervisor_url or '-'}  pid {pid_cell(s)}", "  ")
        adapters = ", ".join(e.adapters) or "-"
        line(
            f"bundle {bundle_cell(e)}  in flight {in_flight(e)}  KV {kv_usage(e)}  adapters {adapters}", "  "
        )
        line(f"router: {router_seen(view, e).text}", "  ")
        if reason := _reason(e):
            line(f"reason: {reason}", "  ")
    return "\n".join(out)
