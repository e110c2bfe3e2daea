"""`corral supervise`'s PRECHECK flags (what a start must be: pinned, of a fingerprint, of a
checkpoint, with a token) and `--explain -- ENGINE COMMAND`: PRECHECK run once on the command as
configured (dependencies not waited for, nothing started), each check and its arithmetic printed; exit 0
when the start would be authorized, 1 when refused.

The flags need click only; PRECHECK itself is imported when a start reads them, so that
`corral supervise --help` starts fast."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from corral.supervisor.precheck.gate import PrecheckSettings

F = TypeVar("F", bound=Callable[..., Any])


def precheck_options(command: F) -> F:
    """The PRECHECK options of `corral supervise run`, in the order --help shows them."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


_OPTIONS = [
    click.option(
        "--gpus",
        "declared_gpus",
        default=None,
        type=click.IntRange(1),
        help="GPUs this engine was sized for: PRECHECK's inventory where NVML is absent, else an expectation "
        "NVML must meet.",
    ),
    click.option(
        "--gpu-memory-gib",
        default=None,
        type=click.FloatRange(min=0.0, min_open=True),
        help="Memory of each GPU in GiB (declared, as --gpus).",
    ),
    click.option(
        "--gpu-model", default=None, metavar="NAME", help="GPU model, e.g. H100 (declared, as --gpus)."
    ),
    click.option(
        "--weights-gib",
        default=None,
        type=click.FloatRange(min=0.0),
        help="Checkpoint size in GiB for PRECHECK's memory budget: for a hub id, or when the files overstate "
        "what is loaded (online quantization). Default: the model directory's *.safetensors.",
    ),
    click.option(
        "--headroom-gib",
        default=None,
        type=click.FloatRange(min=0.0),
        help="Per-rank memory beside weights and KV cache (activations, CUDA graphs, NCCL) in GiB; replaces "
        "the budget's documented estimates.",
    ),
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


def precheck_settings(flags: dict[str, Any]) -> PrecheckSettings:
    """What PRECHECK expects of a start, from `precheck_options`' values (keyed by parameter name)."""
    from corral.supervisor.precheck.budget import BudgetOverrides
    from corral.supervisor.precheck.environment import EnvironmentSettings
    from corral.supervisor.precheck.gate import PrecheckSettings
    from corral.supervisor.precheck.identity import IdentityExpectations
    from corral.supervisor.precheck.inventory import DeclaredGpus

    declared = DeclaredGpus(
        count=flags["declared_gpus"],
        memory_bytes=_gib_bytes(flags["gpu_memory_gib"]),
        model=flags["gpu_model"],
    )
    return PrecheckSettings(
        identity=IdentityExpectations(
            allow_floating_revision=flags["allow_floating_revision"],
            expect_fingerprint=flags["expect_fingerprint"],
            expect_checkpoint_digest=flags["expect_checkpoint_digest"],
        ),
        environment=EnvironmentSettings(
            require_hf_token=flags["require_hf_token"], probe_read_mib=flags["probe_read_mib"]
        ),
        declared_gpus=declared if declared.given else None,
        budget=BudgetOverrides(
            weights_bytes=_gib_bytes(flags["weights_gib"]), headroom_bytes=_gib_bytes(flags["headroom_gib"])
        ),
    )


def _gib_bytes(gib: float | None) -> int | None:
    from corral.supervisor.precheck.budget import GIB

    return None if gib is None else int(gib * GIB)


async def explain_precheck(
    argv: Sequence[str],
    settings: PrecheckSettings,
    preload_argv: Sequence[str],
    say: Callable[[str], None],
) -> int:
    from corral.redaction import redact_argv
    from corral.supervisor.precheck.explain import render
    from corral.supervisor.precheck.gate import run_precheck

    report = await run_precheck(argv, dict(os.environ), settings, preload_argv)
    say(f"PRECHECK of: {' '.join(redact_argv(tuple(argv)))}")
    say(render(report.checks).rstrip("\n"))
    say(f"  fingerprint {report.fingerprint or 'not computed'} (what --expect-fingerprint compares)")
    return 0 if report.authorized else 1
