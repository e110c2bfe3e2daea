"""`corral sleep|wake|reload|lora|switch-bundle --engine NAME` (an engine of a local fleet) or
`--supervisor URL`: start a runbook operation on a supervised engine and follow it step by step until
it is done. Exit 0 when it succeeded, 1 when it failed (RECOVER ran; the step and cause are printed), 2
when it was refused (409: a precondition, nothing changed) or the request was bad. A run that ended,
failed or not, leaves its change record in `$XDG_STATE_HOME/corral/<kind>-<supervisor port>.json` (the
last one of that kind there).

This module only defines the commands and their options, with light imports, so that `--help` starts
fast; what runs them is `runbook_run`, imported when a command runs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

# the most seconds `--observe-seconds` takes: `contracts.operations.OBSERVE_SECONDS_MAX` (a unit test
# holds the two equal; importing the wire models here would cost every `--help` their import time)
OBSERVE_SECONDS_MAX = 3600.0


def _supervisor(command: Callable[..., None]) -> Callable[..., None]:
    """Which engine: `--engine NAME` in the local fleet behind router `--port`, or `--supervisor URL`;
    handed to the command as the supervisor's URL, resolved before it runs."""

    @functools.wraps(command)
    def addressed(**kwargs: Any) -> None:
        url, port, engine = kwargs.pop("supervisor_url"), kwargs.pop("port"), kwargs.pop("engine")
        from corral.supervisor.commands.runbook_run import supervisor_of

        command(supervisor_url=supervisor_of(url, port, engine), **kwargs)

    wrapped: Callable[..., None] = addressed
    for option in reversed(_ADDRESS_OPTIONS):
        wrapped = option(wrapped)
    return wrapped


_ADDRESS_OPTIONS = (
    click.option(
        "--engine",
        default=None,
        metavar="NAME",
        help="The engine, by its name in the local fleet (`corral status` lists them: engine-0, …).",
    ),
    click.option(
        "--port",
        default=8000,
        show_default=True,
        type=click.IntRange(1, 65535),
        help="Router port of the local fleet (`corral up`) that --engine names an engine of.",
    ),
    click.option(
        "--supervisor",
        "supervisor_url",
        default=None,
        metavar="URL",
        help="The engine's supervisor (its management address), for an engine outside a local fleet.",
    ),
)


_token_file = click.option(
    "--token-file",
    type=click.Path(path_type=Path),
    default=None,
    help="Bearer token (else $CORRAL_TOKEN, else the token of the local fleet that lists the supervisor).",
)
_op_id = click.option("--operation-id", default=None, help="Idempotency key: the same id joins the same run.")
_timeout = click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="Seconds to follow the operation; past them the command exits 1 and the operation goes on "
    "(the URL to follow it is printed).",
)


# `--observe-seconds S` closes any runbook operation with OBSERVE: S seconds of the engine's traffic
# compared with its PRECHECK baseline (`runbook/observe.py`).
_OBSERVE_OPTIONS = (
    click.option(
        "--observe-seconds",
        type=click.FloatRange(0.0, OBSERVE_SECONDS_MAX),
        default=None,
        help="Close the operation with S seconds of the engine's traffic compared with its PRECHECK "
        "baseline (OBSERVE); a worse window fails the operation [default: no OBSERVE].",
    ),
    click.option(
        "--observe-max-error-ratio",
        type=click.FloatRange(0.0, 1.0),
        default=None,
        help="How far the window's error ratio may exceed the baseline's [default: 0.05].",
    ),
    click.option(
        "--observe-max-ttft-ratio",
        type=click.FloatRange(1.0, 1000.0),
        default=None,
        help="How many times the baseline's TTFT p99 the window's may be [default: 2].",
    ),
    click.option(
        "--observe-max-itl-ratio",
        type=click.FloatRange(1.0, 1000.0),
        default=None,
        help="How many times the baseline's ITL p99 the window's may be [default: 2; differences "
        "under 25 ms never fail]. Queue depth, KV utilization and GPU memory are judged too, at "
        "their defaults (docs/operations.md).",
    ),
    click.option(
        "--observe-min-requests",
        type=click.IntRange(min=1),
        default=None,
        help="Fewer requests in the window cannot be judged: inconclusive [default: 20].",
    ),
)


def _observed(command: Callable[..., None]) -> Callable[..., None]:
    """The OBSERVE options, handed to the command as one `observe` dict of request fields."""

    @functools.wraps(command)
    def with_observe(**kwargs: Any) -> None:
        observe = {
            "observe_seconds": kwargs.pop("observe_seconds"),
            "max_error_ratio": kwargs.pop("observe_max_error_ratio"),
            "max_ttft_ratio": kwargs.pop("observe_max_ttft_ratio"),
            "max_itl_ratio": kwargs.pop("observe_max_itl_ratio"),
            "min_requests": kwargs.pop("observe_min_requests"),
        }
        command(observe=observe, **kwargs)

    wrapped: Callable[..., None] = with_observe
    for option in reversed(_OBSERVE_OPTIONS):
        wrapped = option(wrapped)
    return wrapped


@click.command(name="sleep")
@_supervisor
@_token_file
@_op_id
@_timeout
@click.option(
    "--level",
    type=click.IntRange(0, 2),
    default=1,
    show_default=True,
    help="0: pause scheduling, all memory stays on the GPU; 1: offload the weights to host memory, drop "
    "the KV cache and prefix cache; 2: drop weights and KV cache (the wake needs --reload).",
)
@click.option(
    "--mode",
    type=click.Choice(["wait", "abort", "keep"]),
    default="wait",
    show_default=True,
    help="Requests in flight once the engine is out of routing: wait lets them finish (within the "
    "supervisor's --drain-timeout), abort cuts them, keep freezes them in the engine and resumes them "
    "after the wake (recomputed if the KV cache was dropped).",
)
@click.option("--release-kv", is_flag=True, help="With --level 0 --mode keep: also free the KV cache.")
@_observed
def sleep_command(
    supervisor_url: str,
    token_file: Path | None,
    operation_id: str | None,
    timeout: float,
    level: int,
    mode: str,
    release_kv: bool,
    observe: dict[str, Any],
) -> None:
    """Take the engine out of routing, drain it by MODE, and put it to sleep at LEVEL."""
    from corral.contracts.operations import SleepRequest
    from corral.supervisor.commands.runbook_run import run_operation

    asked = SleepRequest(level=level, mode=mode, release_kv=release_kv, operation_id=operation_id, **observe)
    run_operation(supervisor_url, asked, token_file, timeout)


@click.command(name="wake")
@_supervisor
@_token_file
@_op_id
@_timeout
@click.option("--reload", "reload_weights", is_flag=True, help="Needed after a level-2 sleep.")
@click.option(
    "--tag",
    "tags",
    multiple=True,
    type=click.Choice(["weights", "kv_cache", "scheduling"]),
    help="Wake only this tag (repeatable); the same as --tags.",
)
@click.option(
    "--tags",
    "tag_list",
    default=None,
    metavar="TAG,TAG",
    help="Wake only these (weights, kv_cache, scheduling), e.g. --tags weights: a partial wake keeps "
    "the engine SLEEPING and out of routing until a wake of the remaining tags (or without tags).",
)
@_observed
def wake_command(
    supervisor_url: str,
    token_file: Path | None,
    operation_id: str | None,
    timeout: float,
    reload_weights: bool,
    tags: tuple[str, ...],
    tag_list: str | None,
    observe: dict[str, Any],
) -> None:
    """Wake the sleeping engine, verify it and make it READY again (or wake it in steps: --tags)."""
    wanted = [*tags, *(t.strip() for t in (tag_list or "").split(",") if t.strip())]
    from corral.contracts.operations import WakeRequest
    from corral.supervisor.commands.runbook_run import run_operation

    asked = WakeRequest(reload=reload_weights, tags=wanted or None, operation_id=operation_id, **observe)
    run_operation(supervisor_url, asked, token_file, timeout)


@click.command(name="reload")
@_supervisor
@_token_file
@_op_id
@_timeout
@click.option(
    "--mode",
    type=click.Choice(["wait", "abort", "keep"]),
    default="wait",
    show_default=True,
    help="Requests in flight before the level-2 sleep: wait lets them finish (within the supervisor's "
    "--drain-timeout), abort cuts them, keep freezes them and recomputes them after the reload.",
)
@_observed
def reload_command(
    supervisor_url: str,
    token_file: Path | None,
    operation_id: str | None,
    timeout: float,
    mode: str,
    observe: dict[str, Any],
) -> None:
    """Reload the engine's weights in place (level-2 sleep, wake weights, reload, wake KV cache)."""
    from corral.contracts.operations import ReloadRequest
    from corral.supervisor.commands.runbook_run import run_operation

    run_operation(
        supervisor_url, ReloadRequest(mode=mode, operation_id=operation_id, **observe), token_file, timeout
    )


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
@_observed
def lora_load_command(
    supervisor_url: str,
    token_file: Path | None,
    operation_id: str | None,
    timeout: float,
    name: str,
    path: str,
    observe: dict[str, Any],
) -> None:
    """Load adapter NAME from PATH; it joins the desired set reloaded after every engine restart."""
    from corral.contracts.operations import LoadAdapterRequest
    from corral.supervisor.commands.runbook_run import run_operation

    asked = LoadAdapterRequest(name=name, path=path, operation_id=operation_id, **observe)
    run_operation(supervisor_url, asked, token_file, timeout)


@lora_group.command(name="unload")
@_supervisor
@_token_file
@_op_id
@_timeout
@click.argument("name")
@_observed
def lora_unload_command(
    supervisor_url: str,
    token_file: Path | None,
    operation_id: str | None,
    timeout: float,
    name: str,
    observe: dict[str, Any],
) -> None:
    """Withdraw adapter NAME from routing, wait for its requests to finish, then unload it."""
    from corral.contracts.operations import UnloadAdapterRequest
    from corral.supervisor.commands.runbook_run import run_operation

    asked = UnloadAdapterRequest(name=name, operation_id=operation_id, **observe)
    run_operation(supervisor_url, asked, token_file, timeout)


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
@_observed
def switch_bundle_command(
    supervisor_url: str,
    token_file: Path | None,
    operation_id: str | None,
    timeout: float,
    ready_timeout: float | None,
    name: str,
    observe: dict[str, Any],
) -> None:
    """Move the engine to bundle NAME, declared on its host (`corral supervise --bundle FILE`): out of
    routing, drained, restarted on the bundle, READY again; the old bundle comes back on failure."""
    from corral.contracts.operations import SwitchBundleRequest
    from corral.supervisor.commands.runbook_run import run_operation

    asked = SwitchBundleRequest(name=name, ready_timeout=ready_timeout, operation_id=operation_id, **observe)
    run_operation(supervisor_url, asked, token_file, timeout)


RUNBOOK_COMMANDS = (sleep_command, wake_command, reload_command, lora_group, switch_bundle_command)
