"""How `corral sleep|wake|reload|lora|switch-bundle` runs once its options are parsed: the engine's
supervisor found by name in a local fleet, the operation started and followed step by step, its change
record kept in `$XDG_STATE_HOME/corral/<kind>-<supervisor port>.json`. Imported only when a command
runs, so that `--help` does not pay for aiohttp and the wire models (`runbook_ops` defines the options)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import click
import orjson
from pydantic import ValidationError

from corral.aio import run as run_on_uvloop
from corral.atomic_file import write_atomically
from corral.clients.calls import APIError
from corral.clients.engine_names import EngineNameError, find_engine, fleet_engines
from corral.clients.supervisor import OperationStillRunning, SupervisorClient
from corral.contracts.operations import OperationRecord, OperationRequest
from corral.contracts.records import ChangeRecord
from corral.contracts.wire import first_message
from corral.fleet_identity import FleetIdentity, FleetIdError
from corral.state_home import corral_state_dir, fleet_listing, supervisor_token_for
from corral.supervisor_tokens import TokenFileError, read_management_token


def supervisor_of(url: str | None, port: int, engine: str | None) -> str:
    """The supervisor URL that --supervisor gives, or that --engine names in the local fleet on --port;
    a usage error naming the fleet's engines when neither (or both) is given, or the name is unknown."""
    if url is not None and engine is not None:
        raise click.UsageError("give --engine NAME (a local fleet's engine) or --supervisor URL, not both")
    if url is not None:
        return url.rstrip("/")
    try:
        if engine is None:
            names = ", ".join(m.name for m in run_on_uvloop(fleet_engines(port)))
            raise click.UsageError(
                f"which engine? name one with --engine NAME (the local fleet on port {port} has: {names}), "
                "or give its --supervisor URL"
            )
        member = run_on_uvloop(find_engine(port, engine))
    except EngineNameError as exc:
        hint = "" if engine is not None else "; for an engine outside a local fleet give --supervisor URL"
        raise click.UsageError(f"{exc}{hint}") from None
    say(f"{member.name}: supervisor {member.supervisor}")
    return member.supervisor


def say(line: str) -> None:
    click.echo(line)


def observed_line(evidence: dict[str, Any]) -> str:
    """OBSERVE's outcome in one line: the verdict and its reason, or why there was none."""
    verdict = evidence.get("verdict")
    if isinstance(verdict, dict):
        return f"{verdict.get('verdict')}: {verdict.get('reason')}"
    return str(evidence.get("not_applicable") or evidence.get("error") or "no verdict")


async def follow_operation(url: str, request: OperationRequest, token: str | None, limit_s: float) -> int:
    async with aiohttp.ClientSession() as session:
        supervisor = SupervisorClient(session, url, token, timeout=30.0)
        try:
            record, started = await supervisor.start(request)
        except APIError as exc:
            if exc.unreachable:
                say(f"supervisor at {url} is not answering: {exc.message}")
                return 1
            say(f"refused (HTTP {exc.status}): {exc.message}")
            return 2
        op_id = record.operation_id
        say(f"{record.kind} {op_id} {'started' if started else 'already known'}")
        try:
            record = await supervisor.wait_for_operation(
                op_id, within=limit_s, on_poll=supervisor.progress_lines(say)
            )
        except OperationStillRunning:
            say(f"{op_id} not finished after {limit_s:g}s; it goes on: GET {url}/v1/operations/{op_id}")
            return 1
    for step in record.steps:
        say(f"  {step.step}: {step.status} ({step.seconds}s)")
        if step.step == "observe":
            say(f"    {observed_line(step.evidence)}")
    keep_change_record(url, record)
    if record.succeeded:
        say(f"{record.kind} {op_id} succeeded")
        return 0
    say(f"{record.kind} {op_id} failed: {record.error}")
    return 1


def change_record_file(kind: str, url: str) -> Path:
    """Where `corral sleep|wake|…` keeps the last change record of `kind` on the supervisor at `url`."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return corral_state_dir() / f"{kind}-{port}.json"


def _fleet_stamp(url: str) -> dict[str, str | None]:
    """The fleet id and run of the local fleet (`corral up`) that lists this supervisor, for its
    record (`corral.fleet_identity`); nothing for a supervisor no fleet file lists."""
    found = fleet_listing(url, corral_state_dir())
    if found is None:
        return {}
    try:
        return FleetIdentity.of_fleet_file(found[1], str(found[0])).stamp()
    except FleetIdError as exc:
        say(f"the record names no fleet: {exc}")
        return {}


def keep_change_record(url: str, record: OperationRecord) -> None:
    """The operation's change record (in its result) written to `change_record_file`, and its path
    printed; a supervisor that sent none, or a record off the schema, is said so and nothing written."""
    body = (record.result or {}).get("change_record")
    if not isinstance(body, dict):
        say("no change record in the operation's result (a supervisor from before change records?)")
        return
    path = change_record_file(record.kind, url)
    try:
        change = ChangeRecord.model_validate({**body, **_fleet_stamp(url)})
        write_atomically(path, orjson.dumps(change.to_file(), option=orjson.OPT_INDENT_2))
    except ValidationError as exc:
        say(f"the operation's change record does not match the schema ({first_message(exc)}); not written")
        return
    except OSError as exc:
        say(f"could not write the change record to {path}: {exc.strerror or exc}")
        return
    say(f"change record: {path}")


def run_operation(url: str, request: OperationRequest, token_file: Path | None, limit_s: float) -> None:
    try:
        token = read_management_token(token_file)
    except TokenFileError as exc:
        click.echo(f"corral: {exc}", err=True)
        sys.exit(2)
    if token is None:  # a supervisor of a local fleet: the token `corral up` made for it
        try:
            token = supervisor_token_for(url, corral_state_dir())
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    sys.exit(run_on_uvloop(follow_operation(url.rstrip("/"), request, token, limit_s)))
