"""`corral supervise`'s PRECHECK flags (what a start must be: pinned, of a fingerprint, of a
checkpoint, with a token) and `--explain -- ENGINE COMMAND`: PRECHECK run once on the command as
configured (dependencies not waited for, nothing started), each check and its arithmetic printed; exit 0
when the start would be authorized, 1 when refused."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from corral.supervisor.checks.engine_auth import redact_argv
from corral.supervisor.precheck.explain import render
from corral.supervisor.precheck.gate import PrecheckSettings, run_precheck

F = TypeVar("F", bound=Callable[..., Any])


def precheck_options(command: F) -> F:
    """The PRECHECK options of `corral supervise run`, in the order --help shows them."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


_OPTIONS = [
    click.option(
        "--allow-floating-revision",
        is_flag=True,
        help="PRECHECK: start a hub model without a pinned commit (--revision missing, a branch or a tag).",
    ),
    click.option(
        "--expect-fingerprint",
        default=None,
        metavar="F",
        help="PRECHECK: refuse a start whose artifact fingerprint is not F (what `corral status` showed).",
    ),
    click.option(
        "--expect-checkpoint-digest",
        default=None,
        metavar="D",
        help="PRECHECK: refuse a start whose model directory's files digest is not D (the bundle's "
        "model_files digest).",
    ),
    click.option(
        "--require-hf-token",
        is_flag=True,
        help="PRECHECK: the model is gated; refuse a start without HF_TOKEN, HUGGING_FACE_HUB_TOKEN or "
        "a token file in the engine's environment (never shown).",
    ),
    click.option(
        "--probe-read-mib",
        default=0,
        show_default=True,
        type=click.IntRange(0),
        help="PRECHECK: read this many MiB of the largest weight file and report MiB/s (0: no probe).",
    ),
    click.option(
        "--explain",
        is_flag=True,
        help="Run PRECHECK on ENGINE COMMAND (dependencies not waited for), print each check and its "
        "arithmetic, start nothing; exit 0 when the start is authorized, 1 when refused.",
    ),
]


async def explain_precheck(
    argv: Sequence[str],
    settings: PrecheckSettings,
    preload_argv: Sequence[str],
    say: Callable[[str], None],
) -> int:
    report = await run_precheck(argv, dict(os.environ), settings, preload_argv)
    say(f"PRECHECK of: {' '.join(redact_argv(tuple(argv)))}")
    say(render(report.checks).rstrip("\n"))
    say(f"  fingerprint {report.fingerprint or 'not computed'} (what --expect-fingerprint compares)")
    return 0 if report.authorized else 1
