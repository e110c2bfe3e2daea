"""`corral status`: every engine's lifecycle state, from its supervisor, beside the router's view of it.

The fleet comes from the file `corral up` writes (`--port` picks which local fleet) or from explicit
`--supervisor`/`--router` URLs. Supervisors are asked concurrently with a short timeout, so one that
hangs shows as unreachable instead of stalling the table.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import click
import orjson
from rich.console import Console
from rich.table import Table

from corral.aio import run
from corral.fleet.status import fetch_fleet
from corral.state_home import local_fleet_file


@dataclass(frozen=True)
class EngineRow:
    name: str
    supervisor: str
    state: dict[str, Any] | None
    error: str = ""


async def _engine_state(session: aiohttp.ClientSession, name: str, url: str, token: str | None) -> EngineRow:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with session.get(
            url + "/v1/state", headers=headers, timeout=aiohttp.ClientTimeout(total=3)
        ) as resp:
            if resp.status != 200:
                return EngineRow(name, url, None, f"/v1/state answered {resp.status}")
            return EngineRow(name, url, await resp.json())
    except (aiohttp.ClientError, TimeoutError) as exc:
        return EngineRow(name, url, None, f"unreachable ({type(exc).__name__})")


async def collect(
    engines: list[tuple[str, str]], router: str | None, token: str | None
) -> tuple[list[EngineRow], list[dict[str, Any]] | None, str]:
    async with aiohttp.ClientSession() as session:
        rows = await asyncio.gather(*(_engine_state(session, n, u, token) for n, u in engines))
        if router is None:
            return list(rows), None, ""
        try:
            return list(rows), await fetch_fleet(session, router), ""
        except (aiohttp.ClientError, TimeoutError) as exc:
            return list(rows), None, f"router {router} unreachable ({type(exc).__name__})"


def _since(epoch_seconds: object) -> str:
    if not isinstance(epoch_seconds, int | float):
        return "-"
    ago = max(0.0, time.time() - float(epoch_seconds))
    return f"{ago:.0f}s ago" if ago < 120 else f"{ago / 60:.0f}m ago"


def render(rows: list[EngineRow], fleet: list[dict[str, Any]] | None, router_error: str) -> Table:
    by_engine_url = {str(e.get("url")): e for e in fleet or []}
    table = Table(title="Corral fleet", title_justify="left")
    for column in ("engine", "state", "since", "reason", "restarts", "pid", "router view"):
        table.add_column(column)
    for row in rows:
        if row.state is None:
            table.add_row(row.name, "[red]?[/red]", "-", row.error, "-", "-", "-")
            continue
        s = row.state
        state = str(s.get("state", "?"))
        sub = s.get("sub_state")
        colour = "green" if state == "READY" else "red" if state == "FAILED" else "yellow"
        engine = s.get("engine") or {}
        routed = by_engine_url.get(str(engine.get("url")))
        if routed is None:
            view = router_error or ("not listed" if fleet is not None else "-")
        else:
            view = f"{routed.get('state')}, {'routable' if routed.get('routable') else 'not routable'}"
            view += f", in flight {routed.get('in_flight', 0)}"
        table.add_row(
            row.name,
            f"[{colour}]{state}[/{colour}]" + (f" ({sub})" if sub else ""),
            _since(s.get("since")),
            str(s.get("reason") or ""),
            str(len(s.get("restarts") or [])),
            str(engine.get("pid") or "-"),
            view,
        )
    return table


@click.command()
@click.option("--port", default=8000, show_default=True, help="Router port of the local fleet (`corral up`).")
@click.option("--supervisor", "supervisors", multiple=True, help="Supervisor URL (repeatable).")
@click.option("--router", default=None, help="Router URL (default: the local fleet's).")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Bearer token for the supervisors' management API (else $CORRAL_TOKEN).",
)
def status(port: int, supervisors: tuple[str, ...], router: str | None, token_file: Path | None) -> None:
    """Show every engine's lifecycle state and the router's view of it."""
    token = os.environ.get("CORRAL_TOKEN")
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise click.BadParameter(
                f"cannot read {token_file}: {exc.strerror}", param_hint="--token-file"
            ) from None
    if supervisors:
        engines = [(f"engine-{i}", u.rstrip("/")) for i, u in enumerate(supervisors)]
    else:
        path = local_fleet_file(port)
        try:
            fleet_file = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            raise click.ClickException(
                f"no local fleet on port {port} ({path} does not exist): start one with `corral up`, "
                "or name the supervisors with --supervisor URL"
            ) from None
        except orjson.JSONDecodeError as exc:
            raise click.ClickException(
                f"{path} is not valid JSON ({exc}); is it a Corral fleet file?"
            ) from None
        engines = [(e["name"], e["supervisor"]) for e in fleet_file.get("engines", [])]
        router = router or fleet_file.get("router")
    rows, fleet, router_error = run(collect(engines, router, token))
    Console().print(render(rows, fleet, router_error))
    if any(r.state is None or r.state.get("state") != "READY" for r in rows):
        raise SystemExit(1)
