"""`corral verify`: run the post-operation checklist against a fleet, print it, write the change record,
and exit 1 when any check fails (warnings are printed, never fatal). This module holds its flags; what
runs the checklist (aiohttp, the wire models, rich) is corral.fleet.checks.verify_run, imported when
the command runs, so that `--help` starts fast."""

from __future__ import annotations

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
)
from corral.engine.evidence import KINDS


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
@click.option(
    "--observe-seconds",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Observe this many seconds of the fleet's traffic through the router first: the `traffic` "
    "check compares the window with the last change record's steady window, and each engine's with "
    "the fleet's; `latency` then compares steady state. 0: no window (one probe only).",
)
@click.option(
    "--max-error-ratio",
    type=click.FloatRange(min=0, max=1),
    default=MAX_ERROR_RATIO,
    show_default=True,
    help="With --observe-seconds: how far the window's error ratio may exceed the baseline's.",
)
@click.option(
    "--max-ttft-ratio",
    type=click.FloatRange(min=1),
    default=MAX_TTFT_RATIO,
    show_default=True,
    help="With --observe-seconds: how many times the baseline's TTFT p99 the window's may be.",
)
@click.option(
    "--max-itl-ratio",
    type=click.FloatRange(min=1),
    default=MAX_ITL_RATIO,
    show_default=True,
    help=f"With --observe-seconds: how many times the baseline's ITL p99 the window's may be "
    f"(differences under {ITL_SLACK_MS:g} ms never fail). Queue depth, KV utilization and GPU memory "
    "are judged too, at their defaults (docs/operations.md).",
)
@click.option(
    "--min-requests",
    type=click.IntRange(min=1),
    default=MIN_REQUESTS,
    show_default=True,
    help="With --observe-seconds: fewer requests in the window cannot be judged (a warning; a "
    "failure with --require-measured).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The supervisors' bearer token (else $CORRAL_TOKEN, else the token `corral up` made for the "
    "local fleet of --port).",
)
@fleet_access_options()
def verify(**flags: Any) -> None:
    """Check a fleet against the post-operation checklist; exit 1 when any check fails."""
    from corral.fleet.checks.verify_run import run_verify

    run_verify(**flags)
