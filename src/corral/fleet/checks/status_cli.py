"""`corral status`: every engine's lifecycle state, supervisor, bundle, in-flight work, KV usage and
adapters, beside the router's view of it; once, or live with `--watch`, or as JSON with `--json`.

The fleet comes from the file `corral up` writes (`--port` picks which local fleet) or from explicit
`--supervisor`/`--router` URLs (a `--router` alone, with no local fleet: the engines it lists).
Members are asked concurrently with a short timeout (`probe.look`), so one that hangs shows as
unreachable instead of stalling the screen. Everything but click is imported when the command runs:
`corral status --help` starts fast.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from corral.clients.access import FleetAccess, fleet_access_options

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from corral.fleet.checks.probe import FleetTarget, FleetView

EXIT_CODES = """Exit code: 0 when every engine is READY or SLEEPING by a runbook sleep (a planned sleep is
not a failure) and the router answers; 3 when nothing is wrong but an engine is changing state
(starting, draining, waking, an operation running); 1 when an engine is FAILED, stopping or
unreachable, the router does not answer, or the fleet cannot be found; 2 for bad options."""


def _screen(view: FleetView, console: Console, layout: str, title: str = "Corral fleet") -> RenderableType:
    """The full table when asked for, or (auto) on a terminal wide enough for it; else the compact text."""
    from rich.text import Text

    from corral.fleet.checks.status_table import FULL_MIN_WIDTH, full_width, render_compact, render_full

    if layout == "full" or (layout == "auto" and console.is_terminal and console.width >= FULL_MIN_WIDTH):
        table = render_full(view, title)
        if layout == "full" or full_width(view) <= console.width:
            return table
    return Text(render_compact(view, console.width if console.is_terminal else 80, title))


def _print_once(view: FleetView, screen: RenderableType, console: Console) -> None:
    """A full table asked for on a narrow screen is printed as wide as it needs, never cut short."""
    from rich.console import Console
    from rich.table import Table

    from corral.fleet.checks.status_table import full_width

    if isinstance(screen, Table) and (needed := full_width(view)) > console.width:
        console = Console(highlight=False, width=needed)
    console.print(screen, soft_wrap=not isinstance(screen, Table))


async def _watch(target: FleetTarget, interval: float, console: Console, layout: str) -> None:
    """On a terminal, one screen redrawn in place; into a pipe or file, one screen per refresh."""
    import asyncio

    from rich.live import Live

    from corral.fleet.checks.probe import look

    if not console.is_terminal:
        while True:
            view = await look(target)
            console.print(_screen(view, console, layout, f"Corral fleet at {time.strftime('%H:%M:%S')}"))
            await asyncio.sleep(interval)
    with Live(console=console, auto_refresh=False) as live:
        while True:
            view = await look(target)
            title = f"Corral fleet at {time.strftime('%H:%M:%S')}"
            live.update(_screen(view, console, layout, title), refresh=True)
            await asyncio.sleep(interval)


@click.command(epilog=EXIT_CODES)
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
@click.option("--json", "as_json", is_flag=True, help="Print the fleet as JSON (shape corral.status/v1).")
@click.option(
    "--layout",
    type=click.Choice(["auto", "compact", "full"]),
    default="auto",
    show_default=True,
    help="full: a table row per engine (a terminal 140+ columns wide); compact: a few lines per engine "
    "within 80 columns (a narrow terminal, a pipe); auto picks.",
)
@click.option("--watch", "-w", is_flag=True, help="Keep the screen refreshed until Ctrl-C.")
@click.option(
    "--interval", default=2.0, show_default=True, type=click.FloatRange(min=0.2), help="--watch period."
)
def status(
    port: int,
    supervisors: tuple[str, ...],
    router: str | None,
    token_file: Path | None,
    access: FleetAccess,
    as_json: bool,
    layout: str,
    watch: bool,
    interval: float,
) -> None:
    """Show every engine's lifecycle state, supervisor, bundle, load and adapters, and the router's
    view of it."""
    import dataclasses

    import orjson
    from rich.console import Console

    from corral.aio import run
    from corral.fleet.checks.probe import FleetTarget, TargetError, look, read_token
    from corral.fleet.checks.status_report import fleet_verdict, status_json
    from corral.state_home import local_fleet_file

    if as_json and watch:
        raise click.UsageError("--json prints the fleet once; leave out --watch")
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
    console = Console(highlight=False)
    if watch:
        try:
            run(_watch(target, interval, console, layout))
        except KeyboardInterrupt:
            pass
        return
    view = run(look(target))
    records = _records_json(target)
    if as_json:
        click.echo(orjson.dumps({**status_json(view), **records}, option=orjson.OPT_INDENT_2).decode())
    else:
        _print_once(view, _screen(view, console, layout), console)
        _print_records(records, console)
    raise SystemExit(int(fleet_verdict(view)))


def _records_json(target: FleetTarget) -> dict[str, Any]:
    """The fleet's id and its last change, from its own records only (a local fleet's; else none)."""
    from corral.fleet.checks.fleet_records import fleet_records
    from corral.state_home import corral_state_dir

    identity = target.identity
    if target.port is None:
        return {"fleet": None, "last_change": None, "ignored_records": []}
    found = fleet_records(corral_state_dir(), target.port, identity)
    return {
        "fleet": {"id": identity.id, "run": identity.run},
        "last_change": found.last.to_json() if found.last is not None else None,
        "ignored_records": found.ignored,
    }


def _print_records(records: dict[str, Any], console: Console) -> None:
    """The fleet's id and its last change, and each record left out, as wide as the compact layout."""
    import textwrap

    fleet, last = records["fleet"], records["last_change"]
    if fleet is None:
        return
    width = console.width if console.is_terminal else 80
    when = time.strftime("%H:%M:%S", time.localtime(last["finished"])) if last else ""
    change = f"{last['kind']} {last['id']} {last['outcome']} at {when}" if last else "none yet"
    named = f"fleet {fleet['id']}, run {fleet['run']}" if fleet["id"] else "fleet: its file names no fleet_id"
    lines = [named, f"last change: {change}"]
    lines += [
        textwrap.fill(f"ignored: {line}", width, subsequent_indent="  ")
        for line in records["ignored_records"]
    ]
    for line in lines:
        console.print(line, markup=False, soft_wrap=True)
