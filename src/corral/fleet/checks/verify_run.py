"""What `corral verify` runs (corral.fleet.checks.verify_cli holds its flags): the post-operation
checklist against a fleet, printed, the change record written, exit 1 when any check fails (warnings
are printed, never fatal)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from corral.aio import run
from corral.clients.access import ROUTER_KEY_FLAG, FleetAccess
from corral.contracts.records import LatencyRecord, StepRecord
from corral.contracts.traffic import WindowThresholds
from corral.engine.evidence import KINDS
from corral.fleet.checks.adapters import adapter_baseline, last_adapters
from corral.fleet.checks.change_record import (
    default_record_path,
    new_record,
    newest_record,
    read_record,
    write_record,
)
from corral.fleet.checks.expected_sleep import ExpectAsleepError, ExpectedAsleep
from corral.fleet.checks.observe import (
    ObservedWindow,
    endpoint_names,
    judge,
    last_steady,
    observe,
    warmup_ttft_ms,
    with_supervisor_memory,
)
from corral.fleet.checks.probe import FleetTarget, FleetView, TargetError, look, read_token
from corral.fleet.checks.verify import FAIL, NOT_MEASURED, PASS, Check, Expectations, run_checks
from corral.fleet.checks.verify_memory import memory_deltas
from corral.fleet_identity import FleetIdentity, ForeignRecord, check_owner

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


def _newest(
    records: list[tuple[str, dict[str, Any] | None]], router: str | None, section: str
) -> dict[str, Any] | None:
    found = newest_record(records, router, lambda record: bool(record.get(section)))
    return found[1] if found is not None else None


def _own_records(
    records: list[tuple[str, dict[str, Any] | None]], fleet: FleetIdentity, written: str
) -> None:
    """Refuse to judge this fleet against a record of another fleet (or one naming no fleet)."""
    for where, body in records:
        if body is None:
            continue
        archive = Path(where).parent / "runs"
        to_do = f"move it away (`corral up` keeps a stopped fleet's records in {archive}/FLEET_ID/)"
        if where == written:
            to_do += ", or pass --record PATH to judge and record this fleet elsewhere"
        try:
            check_owner(body, where, fleet, to_do)
        except ForeignRecord as exc:
            raise click.ClickException(str(exc)) from None


def _unmeasured(
    window: ObservedWindow | None, warmup: dict[str, float], memory_why: str, view: FleetView
) -> list[str]:
    """The record's sections nothing measured, each with why."""
    if window is None:
        no_window = "no traffic window observed (--observe-seconds 0)"
        found = [f"latency.steady: {no_window}", f"request_failures: {no_window}"]
    else:
        found = [f"latency.steady: {window.why_not}"] if window.fleet is None else []
        if window.request_failures is None:
            found.append(f"request_failures: {window.why_not or 'the router reports no request totals'}")
    if not warmup:
        why = view.router_error or (
            "no routed engine has answered a request since it became routable (or the router does not say)"
            if view.target.router
            else "no router given: warmup TTFT is the router's figure (--router)"
        )
        found.append(f"latency.warmup_ttft_ms: {why}")
    if memory_why:
        found.append(f"memory: {memory_why}")
    return found


def run_verify(
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
    observe_seconds: float,
    max_error_ratio: float,
    max_ttft_ratio: float,
    max_itl_ratio: float,
    min_requests: int,
    token_file: Path | None,
    access: FleetAccess,
) -> None:
    """The checklist as the flags ask for it: look, judge, print, record."""
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
    _own_records(records, target.identity, str(path))
    kept = last_adapters(records, removed_adapters, target.router)
    expect = Expectations(
        expect_model, expected_adapters, _explained(explain), expected_asleep, require_measured, kept
    )
    limits = WindowThresholds(
        max_error_ratio=max_error_ratio,
        max_ttft_ratio=max_ttft_ratio,
        max_itl_ratio=max_itl_ratio,
        min_requests=min_requests,
    )
    window = run(observe(target, observe_seconds, click.echo)) if observe_seconds > 0 else None
    looked = time.time()
    view = run(look(target))
    if window is not None:  # a real vLLM's GPU memory: as its supervisor measured it
        window = with_supervisor_memory(window, view.by_engine_url())
    names = endpoint_names(view, view.router_endpoints or [])
    baseline = last_steady(records, target.router)
    judged = None if window is None else judge(window, baseline, limits, names, require_measured)
    observation = judged.observation if judged is not None else None
    checks, ttft_ms = run(run_checks(view, expect, previous, observation))
    Console(width=max(120, Console().width)).print(render(checks))
    failed = [c.name for c in checks if c.verdict == FAIL]
    unmeasured = [c.name for c in checks if c.verdict == NOT_MEASURED]
    served_now = [e.adapters for e in view.engines if e.models is not None]
    memory, memory_why = memory_deltas(view.engines, _newest(records, target.router, "memory"))
    warmup = warmup_ttft_ms(view.router_endpoints or [], names)
    steps = [StepRecord(step="checklist", started=looked, seconds=time.time() - looked, ok=not failed)]
    if judged is not None:
        observed = StepRecord(
            step="observe", started=started, seconds=judged.window.seconds, ok=judged.check.verdict == PASS
        )
        steps.insert(0, observed)
    body = new_record(
        view,
        started,
        outcome="failed" if failed else "succeeded",
        reason=f"failed: {', '.join(failed)}" if failed else "",
        steps=steps,
        request_failures=judged.window.request_failures if judged is not None else None,
        memory=memory,
        latency=judged.latency(warmup) if judged is not None else LatencyRecord(warmup_ttft_ms=warmup),
        endpoint_windows=judged.endpoints if judged is not None else {},
        not_measured=unmeasured + _unmeasured(window, warmup, memory_why, view),
        adapters={"served": adapter_baseline(kept, served_now)},
        ok=not failed,
        failed=failed,
        checks=[c.to_json() for c in checks],
        ttft_ms=ttft_ms if ttft_ms is not None else (previous or {}).get("ttft_ms"),
        expected={
            "model": expect_model,
            "adapters": expected_adapters,
            "adapters_removed_on_purpose": list(removed_adapters),
            "explained": expect.explained,
            "asleep": {a.engine: a.level for a in expected_asleep},
        },
    ).to_file()
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
