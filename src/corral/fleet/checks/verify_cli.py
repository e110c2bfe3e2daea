"""`corral verify`: run the post-operation checklist against a fleet, print it, write the change record,
and exit 1 when any check fails (warnings are printed, never fatal)."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from corral.aio import run
from corral.clients.access import ROUTER_KEY_FLAG, FleetAccess, fleet_access_options
from corral.engine.evidence import KINDS
from corral.fleet.checks.adapters import adapter_baseline, last_adapters
from corral.fleet.checks.change_record import default_record_path, new_record, read_record, write_record
from corral.fleet.checks.expected_sleep import ExpectAsleepError, ExpectedAsleep
from corral.fleet.checks.probe import FleetTarget, TargetError, look, read_token
from corral.fleet.checks.verify import FAIL, NOT_MEASURED, PASS, Check, Expectations, run_checks

_COLOUR = {PASS: "green", FAIL: "red", NOT_MEASURED: "magenta"}


def render(checks: list[Check]) -> Table:
    table = Table(title="corral verify", title_justify="left")
    for column in ("check", "verdict", "evidence"):
        table.add_column(column)
    for c in checks:
        colour = _COLOUR.get(c.verdict, "yellow")
        table.add_row(c.name, f"[{colour}]{c.verdict}[/{colour}]", c.detail)
    return table


def _explained(values: tuple[str, ...]) -> dict[str, str]:
    found: dict[str, str] = {}
    for value in values:
        kind, sep, why = value.partition("=")
        if not sep or kind not in KINDS or not why.strip():
            raise click.BadParameter(
                f"{value!r}: expected KIND=WHY with KIND one of {', '.join(KINDS)}", param_hint="--explain"
            )
        found[kind] = why.strip()
    return found


@click.command()
@click.option("--port", default=8000, show_default=True, help="Router port of the local fleet (`corral up`).")
@click.option(
    "--router", default=None, help="Router URL (with --supervisor: a fleet not run by `corral up`)."
)
@click.option("--supervisor", "supervisors", multiple=True, help="Supervisor URL (repeatable).")
@click.option("--expect-model", default=None, help="Base model every engine must serve.")
@click.option(
    "--expect-adapter",
    "adapters",
    multiple=True,
    help="Adapter every engine must have loaded (repeatable); with --expect-no-adapters none.",
)
@click.option("--expect-no-adapters", is_flag=True, help="No engine may have an adapter loaded.")
@click.option(
    "--allow-adapter-removal",
    "removed_adapters",
    multiple=True,
    metavar="NAME",
    help="An adapter the last change record (verify, rollout or rollback) served that was unloaded on "
    "purpose: its absence passes (repeatable). Without it, an adapter served before and not now fails.",
)
@click.option(
    "--expect-asleep",
    "asleep",
    multiple=True,
    metavar="ENGINE[=LEVEL]",
    help="After a planned sleep: ENGINE (name, supervisor URL or engine URL) must be asleep, at LEVEL "
    "when given (0, 1, 2), fully (no partial wake) and out of routing; the others awake (repeatable).",
)
@click.option(
    "--explain",
    "explain",
    multiple=True,
    metavar="KIND=WHY",
    help=f"Accept an operation-log event of KIND ({', '.join(KINDS)}), with the reason recorded.",
)
@click.option(
    "--record",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Change record to compare against, then write [default: $XDG_STATE_HOME/corral/verify-PORT.json].",
)
@click.option(
    "--require-measured",
    is_flag=True,
    help="A check nothing could measure (memory without engine figures or NVML, KV size without a "
    "budget) fails instead of reporting NOT MEASURED.",
)
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None)
@fleet_access_options()
def verify(
    port: int,
    router: str | None,
    supervisors: tuple[str, ...],
    expect_model: str | None,
    adapters: tuple[str, ...],
    expect_no_adapters: bool,
    removed_adapters: tuple[str, ...],
    asleep: tuple[str, ...],
    explain: tuple[str, ...],
    record: Path | None,
    require_measured: bool,
    token_file: Path | None,
    access: FleetAccess,
) -> None:
    """Check a fleet against the post-operation checklist; exit 1 when any check fails."""
    started = time.time()
    try:
        target = FleetTarget.resolve(port, router, supervisors, read_token(token_file), access)
    except TargetError as exc:
        raise click.ClickException(str(exc)) from None
    expected_adapters = () if expect_no_adapters else (adapters or None)
    try:
        expected_asleep = tuple(ExpectedAsleep.parse(spec) for spec in asleep)
    except ExpectAsleepError as exc:
        raise click.BadParameter(str(exc), param_hint="--expect-asleep") from None
    path = record or default_record_path("verify", port)
    previous = read_record(path)
    operations = [default_record_path(kind, port) for kind in ("rollout", "rollback")]
    records = [(str(path), previous), *((str(p), read_record(p)) for p in operations)]
    kept = last_adapters(records, removed_adapters, target.router)
    expect = Expectations(
        expect_model, expected_adapters, _explained(explain), expected_asleep, require_measured, kept
    )
    view = run(look(target))
    checks, ttft_ms = run(run_checks(view, expect, previous))
    Console(width=max(120, Console().width)).print(render(checks))
    failed = [c.name for c in checks if c.verdict == FAIL]
    unmeasured = [c.name for c in checks if c.verdict == NOT_MEASURED]
    body = new_record("verify", view, started)
    served_now = [e.adapters for e in view.engines if e.models is not None]
    body.update(
        adapters={"served": adapter_baseline(kept, served_now)},
        ok=not failed,
        failed=failed,
        not_measured=unmeasured,
        checks=[c.to_json() for c in checks],
        ttft_ms=ttft_ms if ttft_ms is not None else (previous or {}).get("ttft_ms"),
        expected={
            "model": expect_model,
            "adapters": expected_adapters,
            "adapters_removed_on_purpose": list(removed_adapters),
            "explained": expect.explained,
            "asleep": {a.engine: a.level for a in expected_asleep},
        },
    )
    write_record(path, body)
    click.echo(f"change record: {path}")
    if view.router_refused:
        click.echo(view.router_error, err=True)  # the table folds it; here it is whole, with the flag
    for c in checks:
        if c.name == "smoke" and c.verdict == FAIL and ROUTER_KEY_FLAG in c.detail:
            click.echo(f"smoke: {c.detail}", err=True)  # the same: whole, with the flag
    if unmeasured:
        click.echo(f"NOT MEASURED: {', '.join(unmeasured)} (--require-measured makes these fail)")
    if failed:
        click.echo(f"FAILED: {', '.join(failed)}")
        raise SystemExit(1)
