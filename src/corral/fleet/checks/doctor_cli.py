"""`corral doctor`: one command that says what is wrong with a fleet, where in the runbook's diagnosis
tree, with the evidence and the Corral command to run next; a table, or `--json` (shape
`corral.doctor/v1`). Exits 1 when anything is wrong.

The diagnosis (aiohttp, the wire models) and the table (rich) are imported when the command runs, so
that `--help` starts fast."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from corral.clients.access import FleetAccess, fleet_access_options

if TYPE_CHECKING:
    from rich.table import Table

    from corral.fleet.checks.doctor import Diagnosis


def render(found: list[Diagnosis]) -> Table:
    from rich.table import Table

    table = Table(title="corral doctor", title_justify="left")
    for column in ("member", "branch", "evidence", "next"):
        table.add_column(column, overflow="fold")
    for d in found:
        colour = "green" if d.healthy else "red"
        table.add_row(d.engine, f"[{colour}]{d.branch}[/{colour}]", d.evidence, d.next_command)
    return table


@click.command()
@click.option("--port", default=8000, show_default=True, help="Router port of the local fleet (`corral up`).")
@click.option(
    "--router", default=None, help="Router URL (with --supervisor: a fleet not run by `corral up`)."
)
@click.option("--supervisor", "supervisors", multiple=True, help="Supervisor URL (repeatable).")
@click.option(
    "--probe-seconds",
    default=3.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="How long a READY engine may take to stream one token before it counts as hung.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The supervisors' bearer token (else $CORRAL_TOKEN, else the token `corral up` made for the "
    "local fleet of --port).",
)
@fleet_access_options()
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON (shape corral.doctor/v1).")
def doctor(
    port: int,
    router: str | None,
    supervisors: tuple[str, ...],
    probe_seconds: float,
    token_file: Path | None,
    access: FleetAccess,
    as_json: bool,
) -> None:
    """Walk the diagnosis tree for every engine and the router; print each branch found, with the
    evidence and the command to run next. Exit code: 0 when every member is healthy, 1 otherwise."""
    import orjson
    from rich.console import Console

    from corral.aio import run
    from corral.fleet.checks.doctor import diagnose
    from corral.fleet.checks.probe import FleetTarget, TargetError, look, read_token

    try:
        token = read_token(token_file)
        target = FleetTarget.resolve(port, router, supervisors, token, access)
    except TargetError as exc:
        raise click.ClickException(str(exc)) from None
    view = run(look(target))
    found = run(diagnose(view, probe_seconds))
    healthy = all(d.healthy for d in found)
    if as_json:
        body = {
            "schema": "corral.doctor/v1",
            "healthy": healthy,
            "exit_code": 0 if healthy else 1,
            "findings": [d.to_json() for d in found],
        }
        click.echo(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
    else:
        Console(width=max(140, Console().width)).print(render(found))
        for d in found:
            click.echo(f"branch {d.engine}: {d.branch}")
    if not healthy:
        raise SystemExit(1)
