"""`corral sleep|wake|reload|lora|switch-bundle --supervisor URL`: start a runbook operation on a
supervised engine and follow it step by step until it is done. Exit 0 when it succeeded, 1 when it
failed (RECOVER ran; the step and cause are printed), 2 when it was refused (409: a precondition,
nothing changed) or the request was bad."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import click
import orjson

from corral.aio import run as run_on_uvloop
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


async def follow_operation(
    url: str, path: str, body: dict[str, Any], token: str | None, limit_s: float
) -> int:
    headers = {"content-type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as session:
        try:
            async with session.post(url + path, data=orjson.dumps(body)) as resp:
                answer = orjson.loads(await resp.read() or b"null")
                status = resp.status
        except aiohttp.ClientError as exc:
            _say(f"supervisor at {url} is not answering: {exc}")
            return 1
        if status not in (200, 202):
            message = answer.get("error", {}).get("message") if isinstance(answer, dict) else answer
            _say(f"refused (HTTP {status}): {message}")
            return 2
        op_id = str(answer["operation_id"])
        _say(f"{answer['kind']} {op_id} {'started' if status == 202 else 'already known'}")
        deadline = time.monotonic() + limit_s
        shown = ""
        while time.monotonic() < deadline:
            async with session.get(f"{url}/v1/operations/{op_id}") as resp:
                op = orjson.loads(await resp.read())
            async with session.get(url + "/v1/state") as resp:
                state = orjson.loads(await resp.read())
            line = f"{state.get('state')}/{state.get('sub_state')}: {state.get('reason')}"
            if line != shown:
                _say(line)
                shown = line
            if op.get("status") != "running":
                for step in (op.get("result") or {}).get("steps", []):
                    _say(f"  {step['step']}: {step['status']} ({step['seconds']}s)")
                if op["status"] == "succeeded":
                    _say(f"{op['kind']} {op_id} succeeded")
                    return 0
                _say(f"{op['kind']} {op_id} failed: {op.get('error')}")
                return 1
            await asyncio.sleep(0.3)
    _say(f"{op_id} not finished after {limit_s:g}s; it goes on: GET {url}/v1/operations/{op_id}")
    return 1


def _run(url: str, path: str, body: dict[str, Any], token_file: Path | None, limit_s: float) -> None:
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
    sys.exit(run_on_uvloop(follow_operation(url.rstrip("/"), path, body, token, limit_s)))


def _with_id(body: dict[str, Any], op_id: str | None) -> dict[str, Any]:
    return {**body, "operation_id": op_id} if op_id else body


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
    body = {"level": level, "mode": mode, "release_kv": release_kv}
    _run(supervisor_url, "/v1/sleep", _with_id(body, operation_id), token_file, timeout)


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
    body: dict[str, Any] = {"reload": reload_weights}
    wanted = [*tags, *(t.strip() for t in (tag_list or "").split(",") if t.strip())]
    if wanted:
        body["tags"] = wanted
    _run(supervisor_url, "/v1/wake", _with_id(body, operation_id), token_file, timeout)


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
    _run(supervisor_url, "/v1/reload", _with_id({"mode": mode}, operation_id), token_file, timeout)


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
    _run(
        supervisor_url,
        "/v1/lora/load",
        _with_id({"name": name, "path": path}, operation_id),
        token_file,
        timeout,
    )


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
    _run(supervisor_url, "/v1/lora/unload", _with_id({"name": name}, operation_id), token_file, timeout)


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
    body: dict[str, Any] = {"name": name}
    if ready_timeout is not None:
        body["ready_timeout"] = ready_timeout
    _run(supervisor_url, "/v1/bundle", _with_id(body, operation_id), token_file, timeout)


RUNBOOK_COMMANDS = (sleep_command, wake_command, reload_command, lora_group, switch_bundle_command)
