"""`corral status`: every engine's lifecycle state, bundle, in-flight work, KV usage and adapters, beside
the router's view of it; once, or live with `--watch`.

The fleet comes from the file `corral up` writes (`--port` picks which local fleet) or from explicit
`--supervisor`/`--router` URLs (a `--router` alone, with no local fleet: the engines it lists).
Members are asked concurrently with a short timeout (`probe.look`), so one that hangs shows as
unreachable instead of stalling the table.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import click
from rich.console import Console
from rich.live import Live

from corral.aio import run
from corral.clients.access import FleetAccess, fleet_access_options
from corral.engine_state import EngineState
from corral.fleet.checks.probe import FleetTarget, FleetView, TargetError, look, read_token
from corral.fleet.checks.status_table import render_view
from corral.state_home import local_fleet_file


def _all_ready(view: FleetView) -> bool:
    return all(e.lifecycle == EngineState.READY for e in view.engines if e.supervisor_url is not None)


async def _watch(target: FleetTarget, interval: float, console: Console) -> None:
    """On a terminal, one table redrawn in place; into a pipe or file, one table per refresh."""
    if not console.is_terminal:
        while True:
            view = await look(target)
            console.print(render_view(view, f"Corral fleet at {time.strftime('%H:%M:%S')}"))
            await asyncio.sleep(interval)
    with Live(console=console, auto_refresh=False) as live:
        while True:
            view = await look(target)
            live.update(render_view(view, f"Corral fleet at {time.strftime('%H:%M:%S')}"), refresh=True)
            await asyncio.sleep(interval)


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
@fleet_access_options()
@click.option("--watch", "-w", is_flag=True, help="Keep the table on screen, refreshed, until Ctrl-C.")
@click.option(
    "--interval", default=2.0, show_default=True, type=click.FloatRange(min=0.2), help="--watch period."
)
def status(
    port: int,
    supervisors: tuple[str, ...],
    router: str | None,
    token_file: Path | None,
    access: FleetAccess,
    watch: bool,
    interval: float,
) -> None:
    """Show every engine's lifecycle state, bundle, load and adapters, and the router's view of it."""
    try:
        token = read_token(token_file)
        # without --supervisor, the local fleet's file names the engines; --router only replaces its router
        if router is not None and not supervisors and not local_fleet_file(port).exists():
            target = FleetTarget(None, [], token, access)  # no local fleet: the router's engines only
        else:
            target = FleetTarget.resolve(port, None, supervisors, token, access)
    except TargetError as exc:
        raise click.ClickException(str(exc)) from None
    if router is not None:
        target = dataclasses.replace(target, router=router.rstrip("/"))
    console = Console()
    if watch:
        try:
            run(_watch(target, interval, console))
        except KeyboardInterrupt:
            pass
        return
    view = run(look(target))
    console.print(render_view(view))
    if view.router_error:
        click.echo(f"corral status: {view.router_error}", err=True)
        raise SystemExit(1)
    if not _all_ready(view):
        raise SystemExit(1)
