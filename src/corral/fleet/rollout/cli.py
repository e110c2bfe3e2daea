"""`corral rollout --to bundle.yaml` and `corral rollback`: their flags. What runs them (aiohttp, the
rollout itself, the wire models) is corral.fleet.rollout.cli_run, imported when a command runs, so that
`--help` starts fast.

The fleet is named by `--fleet FILE` (YAML or JSON with `router`, `control` and `token_file`; the file
`corral up` writes has them) or, by default, the local fleet of `--port`. Progress is printed live,
one line per step as it starts and ends; the change record is written whatever the outcome, and the
exit code is 0 only when every step and the post-check passed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from corral.clients.access import fleet_access_options
from corral.contracts.window_defaults import (
    ITL_SLACK_MS,
    MAX_ERROR_RATIO,
    MAX_ITL_RATIO,
    MAX_TTFT_RATIO,
    MIN_REQUESTS,
    TTFT_SLACK_MS,
)
from corral.tracing.flag import otlp_traces_option


def _settings_options(f: Any) -> Any:
    options = [
        click.option(
            "--fleet", type=click.Path(dir_okay=False, path_type=Path), help="Fleet file (YAML/JSON)."
        ),
        click.option(
            "--port", default=8000, show_default=True, help="Router port of a local `corral up` fleet."
        ),
        click.option(
            "--max-surge",
            default=1,
            show_default=True,
            type=click.IntRange(0, 64),
            help="Serving groups started beyond the fleet's size at once (needs spare capacity).",
        ),
        click.option(
            "--max-unavailable",
            default=0,
            show_default=True,
            type=click.IntRange(0, 64),
            help="Serving groups taken down before their replacement is up (with --max-surge 0).",
        ),
        click.option(
            "--routed-timeout",
            default=30.0,
            show_default=True,
            type=click.FloatRange(min=1),
            help="Seconds for the router to route a new engine or drop an old one.",
        ),
        click.option(
            "--start-timeout",
            default=600.0,
            show_default=True,
            type=click.FloatRange(min=1),
            help="Seconds a new serving group may take to be READY (startup, smoke, readiness).",
        ),
        click.option(
            "--min-prefill",
            default=1,
            show_default=True,
            type=click.IntRange(min=0),
            help="A prefill/decode fleet: prefill engines that must stay routable and paired with a "
            "compatible decode engine at every step (PRECHECK refuses a plan that cannot keep them).",
        ),
        click.option(
            "--min-decode",
            default=1,
            show_default=True,
            type=click.IntRange(min=0),
            help="A prefill/decode fleet: decode engines that must stay routable and paired with a "
            "compatible prefill engine at every step.",
        ),
        click.option(
            "--record",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Change record to write [default: $XDG_STATE_HOME/corral/KIND-PORT.json].",
        ),
        click.option(
            "--supervisor-token-file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="The supervisors' bearer token [default: from the fleet file: its supervisor_token_file "
            "for a `corral up` fleet, its token_file for a supervisors list].",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return canary_options(fleet_access_options()(f))


def canary_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--canary-seconds and its thresholds, given to the command as `canary: CanarySettings`."""

    @functools.wraps(command)
    def with_canary(
        *args: Any,
        canary_seconds: float,
        canary_max_error_ratio: float,
        canary_max_ttft_ratio: float,
        canary_max_itl_ratio: float,
        canary_min_requests: int,
        **kwargs: Any,
    ) -> Any:
        from corral.contracts.traffic import WindowThresholds
        from corral.fleet.rollout.canary import CanarySettings

        limits = WindowThresholds(
            max_error_ratio=canary_max_error_ratio,
            max_ttft_ratio=canary_max_ttft_ratio,
            max_itl_ratio=canary_max_itl_ratio,
            min_requests=canary_min_requests,
        )
        return command(*args, canary=CanarySettings(canary_seconds, limits), **kwargs)

    options = [
        click.option(
            "--canary-seconds",
            default=0.0,
            show_default=True,
            type=click.FloatRange(min=0),
            help="After each new group is routed, compare its errors and TTFT with the old groups' over "
            "this many seconds of real traffic before the old group is drained; 0: no canary.",
        ),
        click.option(
            "--canary-max-error-ratio",
            default=MAX_ERROR_RATIO,
            show_default=True,
            type=click.FloatRange(0, 1),
            help="How far the new group's error ratio may exceed the old groups' (0.05: five points).",
        ),
        click.option(
            "--canary-max-ttft-ratio",
            default=MAX_TTFT_RATIO,
            show_default=True,
            type=click.FloatRange(min=1),
            help=f"How many times the old groups' TTFT p99 the new group's may be (differences under "
            f"{TTFT_SLACK_MS:g} ms never fail).",
        ),
        click.option(
            "--canary-max-itl-ratio",
            default=MAX_ITL_RATIO,
            show_default=True,
            type=click.FloatRange(min=1),
            help=f"How many times the old groups' ITL p99 the new group's may be (differences under "
            f"{ITL_SLACK_MS:g} ms never fail). Queue depth and KV utilization, read from the engines' "
            "/metrics, are judged too, per engine, at their defaults (docs/operations.md).",
        ),
        click.option(
            "--canary-min-requests",
            default=MIN_REQUESTS,
            show_default=True,
            type=click.IntRange(min=0),
            help="Requests the new group must serve in the window to be judged; fewer fails the canary "
            "(0 accepts a quiet window).",
        ),
    ]
    for option in reversed(options):
        with_canary = option(with_canary)
    return with_canary


@click.command()
@click.option(
    "--to", "to", required=True, type=click.Path(dir_okay=False, path_type=Path), help="The bundle file."
)
@_settings_options
@otlp_traces_option  # --otlp-traces-endpoint (corral.tracing.flag): the record's trace
def rollout(**flags: Any) -> None:
    """Move a Corral-run fleet to another bundle, one serving group at a time, losing no request."""
    from corral.fleet.rollout.cli_run import ChangeFlags, run_rollout

    to = flags.pop("to")
    run_rollout(to, ChangeFlags(**flags))


@click.command()
@click.option(
    "--from-record",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The record of the rollout (or rollback) to undo "
    "[default: $XDG_STATE_HOME/corral/rollout-PORT.json].",
)
@_settings_options
@otlp_traces_option
def rollback(**flags: Any) -> None:
    """Move the fleet back to the bundle the last rollout started from, the same way."""
    from corral.fleet.rollout.cli_run import ChangeFlags, run_rollback

    from_record = flags.pop("from_record")
    run_rollback(from_record, ChangeFlags(**flags))
