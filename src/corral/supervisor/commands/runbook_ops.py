"""`corral sleep|wake|reload|lora|switch-bundle --supervisor URL`: start a runbook operation on a
supervised engine and follow it step by step until it is done. Exit 0 when it succeeded, 1 when it
failed (RECOVER ran; the step and cause are printed), 2 when it was refused (409: a precondition,
nothing changed) or the request was bad."""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp
import click

from corral.aio import run as run_on_uvloop
from corral.clients.calls import APIError
from corral.clients.supervisor import OperationStillRunning, SupervisorClient
from corral.contracts.operations import (
    LoadAdapterRequest,
    OperationRequest,
    ReloadRequest,
    SleepRequest,
    SwitchBundleRequest,
    UnloadAdapterRequest,
    WakeRequest,
)
from corral.fleet.local.ownership import supervisor_token_for
from corral.state_home import corral_state_dir
from corral.supervisor_tokens import TokenFileError, read_management_token

_supervisor = click.option(
    "--supervisor",
    "supervisor_url",
    default="http://127.0.0.1:8081",
    show_default=True,
    help="The supervisor's management address.",
)
_token_file = click.option(
    "--token-file",
    type=click.Path(path_type=Path),
    default=None,
    help="Bearer token (else $CORRAL_TOKEN, else the token of the local fleet that lists the supervisor).",
)
_op_id = click.option("--operation-id", default=None, help="Idempotency key: the same id joins the same run.")
_timeout = click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(min=1.0))


def _say(line: str) -> None:
    click.echo(line)


async def follow_operation(url: str, request: OperationRequest, token: str | None, limit_s: float) -> int:
    async with aiohttp.ClientSession() as session:
        supervisor = SupervisorClient(session, url, token, timeout=30.0)
        try:
            record, started = await supervisor.start(request)
        except APIError as exc:
            if exc.unreachable:
                _say(f"supervisor at {url} is not answering: {exc.message}")
                return 1
            _say(f"refused (HTTP {exc.status}): {exc.message}")
            return 2
        op_id = record.operation_id
        _say(f"{record.kind} {op_id} {'started' if started else 'already known'}")
        try:
            record = await supervisor.wait_for_operation(
                op_id, within=limit_s, on_poll=supervisor.progress_lines(_say)
            )
        except OperationStillRunning:
            _say(f"{op_id} not finished after {limit_s:g}s; it goes on: GET {url}/v1/operations/{op_id}")
            return 1
    for step in record.steps:
        _say(f"  {step.step}: {step.status} ({step.seconds}s)")
    if record.succeeded:
        _say(f"{record.kind} {op_id} succeeded")
        return 0
    _say(f"{record.kind} {op_id} failed: {record.error}")
    return 1


def _run(url: str, request: OperationRequest, token_file: Path | None, limit_s: float) -> None:
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


@click.command(name="sleep")
@_supervisor
@_token_file
@_op_id
@_timeout
@click.option("--level", type=click.IntRange(0, 2), default=1, show_default=True)
@click.option("--mode", type=click.Choice(["wait", "abort", "keep"]), default="wait", show_default=True)
@click.option("--release-kv", is_flag=True, help="With --level 0 --mode keep: also free the KV cache.")
def sleep_command(
    supervisor_url: str,
    token_file: Path | None,
    operation_id: str | None,
    timeout: float,
    level: int,
    mode: str,
    release_kv: bool,
) -> None:
    """Take the engine out of routing, drain it by MODE, and put it to sleep at LEVEL."""
    asked = SleepRequest(level=level, mode=mode, release_kv=release_kv, operation_id=operation_id)
    _run(supervisor_url, asked, token_file, timeout)


@click.command(name="wake")
@_supervisor
@_token_file
@_op_id
@_timeout
@click.option("--reload", "reload_weights", is_flag=True, help="Needed after a level-2 sleep.")
@click.option("--tag", "tags", multiple=True, type=click.Choice(["weights", "kv_cache", "scheduling"]))
@click.option(
    "--tags",
    "tag_list",
    default=None,
    metavar="TAG,TAG",
    help="Wake only these (weights, kv_cache, scheduling), e.g. --tags weights: a partial wake keeps "
    "the engine SLEEPING and out of routing until a wake of the remaining tags (or without tags).",
)
def wake_command(
    supervisor_url: str,
    token_file: Path | None,
    operation_id: str | None,
    timeout: float,
    reload_weights: bool,
    tags: tuple[str, ...],
    tag_list: str | None,
) -> None:
    """Wake the sleeping engine, verify it and make it READY again (or wake it in steps: --tags)."""
    wanted = [*tags, *(t.strip() for t in (tag_list or "").split(",") if t.strip())]
    asked = WakeRequest(reload=reload_weights, tags=wanted or None, operation_id=operation_id)
    _run(supervisor_url, asked, token_file, timeout)


@click.command(name="reload")
@_supervisor
@_token_file
@_op_id
@_timeout
@click.option("--mode", type=click.Choice(["wait", "abort", "keep"]), default="wait", show_default=True)
def reload_command(
    supervisor_url: str, token_file: Path | None, operation_id: str | None, timeout: float, mode: str
) -> None:
    """Reload the engine's weights in place (level-2 sleep, wake weights, reload, wake KV cache)."""
    _run(supervisor_url, ReloadRequest(mode=mode, operation_id=operation_id), token_file, timeout)


@click.group(name="lora")
def lora_group() -> None:
    """Load or unload a LoRA adapter on a supervised engine (`corral lora load|unload`)."""


@lora_group.command(name="load")
@_supervisor
@_token_file
@_op_id
@_timeout
@click.argument("name")
@click.argument("path")
def lora_load_command(
    supervisor_url: str,
    token_file: Path | None,
    operation_id: str | None,
    timeout: float,
    name: str,
    path: str,
) -> None:
    """Load adapter NAME from PATH; it joins the desired set reloaded after every engine restart."""
    asked = LoadAdapterRequest(name=name, path=path, operation_id=operation_id)
    _run(supervisor_url, asked, token_file, timeout)


@lora_group.command(name="unload")
@_supervisor
@_token_file
@_op_id
@_timeout
@click.argument("name")
def lora_unload_command(
    supervisor_url: str, token_file: Path | None, operation_id: str | None, timeout: float, name: str
) -> None:
    """Withdraw adapter NAME from routing, wait for its requests to finish, then unload it."""
    _run(supervisor_url, UnloadAdapterRequest(name=name, operation_id=operation_id), token_file, timeout)


@click.command(name="switch-bundle")
@_supervisor
@_token_file
@_op_id
@_timeout
@click.option(
    "--ready-timeout",
    type=click.FloatRange(min=1.0),
    default=None,
    help="Seconds the restarted engine may take to be READY [default: the supervisor's startup timeout].",
)
@click.argument("name")
def switch_bundle_command(
    supervisor_url: str,
    token_file: Path | None,
    operation_id: str | None,
    timeout: float,
    ready_timeout: float | None,
    name: str,
) -> None:
    """Move the engine to bundle NAME, declared on its host (`corral supervise --bundle FILE`): out of
    routing, drained, restarted on the bundle, READY again; the old bundle comes back on failure."""
    asked = SwitchBundleRequest(name=name, ready_timeout=ready_timeout, operation_id=operation_id)
    _run(supervisor_url, asked, token_file, timeout)


RUNBOOK_COMMANDS = (sleep_command, wake_command, reload_command, lora_group, switch_bundle_command)
