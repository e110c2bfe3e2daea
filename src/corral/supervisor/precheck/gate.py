"""The PRECHECK gate: every check in order (artifact identity → parallel identity → memory budget →
environment → preload pair) over one engine command, and the report that authorizes its start or
refuses it with the first refusing check's reason. Disk and subprocess work runs off the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from corral.supervisor.precheck.budget import BudgetOverrides, memory_budget
from corral.supervisor.precheck.check import CheckResult, Outcome
from corral.supervisor.precheck.environment import EnvironmentSettings, check_environment
from corral.supervisor.precheck.identity import (
    Artifact,
    IdentityExpectations,
    check_identity,
    read_artifact,
)
from corral.supervisor.precheck.inventory import DeclaredGpus, GpuInventory, read_inventory
from corral.supervisor.precheck.parallel import parallel_identity
from corral.supervisor.precheck.preload_pair import check_preload_pair


@dataclass(frozen=True)
class PrecheckSettings:
    """What PRECHECK expects of a start, from the supervisor's flags (and a bundle's fingerprint)."""

    identity: IdentityExpectations = field(default_factory=IdentityExpectations)
    environment: EnvironmentSettings = field(default_factory=EnvironmentSettings)
    declared_gpus: DeclaredGpus | None = None  # --gpus/--gpu-memory-gib/--gpu-model
    budget: BudgetOverrides = field(default_factory=BudgetOverrides)  # --weights-gib/--headroom-gib

    def environment_settings(self) -> EnvironmentSettings:
        """The download a hub model needs is the declared checkpoint size (--weights-gib)."""
        if self.environment.download_bytes is not None or self.budget.weights_bytes is None:
            return self.environment
        return replace(self.environment, download_bytes=self.budget.weights_bytes)


@dataclass(frozen=True)
class PrecheckReport:
    """The checks of one PRECHECK, in order; authorized when none refused (not_measured never
    counts as passed, and never refuses)."""

    checks: list[CheckResult]
    artifact: Artifact | None
    started_at: float
    finished_at: float

    @property
    def refusal(self) -> CheckResult | None:
        return next((c for c in self.checks if c.refused), None)

    @property
    def authorized(self) -> bool:
        return self.refusal is None

    @property
    def reason(self) -> str:
        refusal = self.refusal
        if refusal is not None:
            return f"PRECHECK refused the start: {refusal.name}: {refusal.reason}"
        unmeasured = [c.name for c in self.checks if c.outcome is Outcome.NOT_MEASURED]
        note = f" ({', '.join(unmeasured)} not measured)" if unmeasured else ""
        return f"PRECHECK authorized the start{note}"

    @property
    def fingerprint(self) -> str | None:
        return self.artifact.fingerprint if self.artifact is not None else None

    def summary(self) -> dict[str, Any]:
        """Outcome and reasons without the evidence: what an unauthenticated probe may show."""
        return {
            "outcome": "authorized" if self.authorized else "refused",
            "reason": self.reason,
            "fingerprint": self.fingerprint,
            "authorized_at": self.finished_at if self.authorized else None,
            "checks": [{"name": c.name, "outcome": c.outcome.value, "reason": c.reason} for c in self.checks],
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": "authorized" if self.authorized else "refused",
            "reason": self.reason,
            "fingerprint": self.fingerprint,
            "authorized_at": self.finished_at if self.authorized else None,
            "started_at": self.started_at,
            "checks": [c.to_json() for c in self.checks],
        }


def hardware_part(gpus: GpuInventory | None) -> dict[str, Any] | None:
    """What the fingerprint records of the GPUs: their model and count (not their memory or UUIDs,
    which differ between hosts that serve the same bundle)."""
    return {"gpu_model": gpus.model, "gpu_count": gpus.count} if gpus is not None else None


def _run_checks(
    argv: Sequence[str],
    env: Mapping[str, str],
    preload_argv: Sequence[str],
    settings: PrecheckSettings,
) -> tuple[list[CheckResult], Artifact | None]:
    gpus = read_inventory(argv, env, settings.declared_gpus)
    artifact = read_artifact(argv, env, hardware_part(gpus), preload_argv)
    checks = [
        check_identity(artifact, settings.identity),
        parallel_identity(argv, gpus),
        memory_budget(argv, gpus, settings.budget, env),
        check_environment(argv, env, artifact.engine, artifact.model_kind, settings.environment_settings()),
        check_preload_pair(argv, preload_argv, env),
    ]
    return checks, artifact


async def run_precheck(
    argv: Sequence[str],
    env: Mapping[str, str],
    settings: PrecheckSettings,
    preload_argv: Sequence[str] = (),
) -> PrecheckReport:
    """Every check over the engine command `argv` started in `env` (the merged environment it will
    get); blocking reads (model files, an interpreter asked its vLLM version, NVML) in a thread."""
    started = time.time()
    try:
        checks, artifact = await asyncio.to_thread(_run_checks, argv, env, preload_argv, settings)
    except Exception as exc:  # a check that cannot run refuses rather than letting an unknown start
        checks = [
            CheckResult(
                "precheck",
                Outcome.REFUSED,
                f"a check could not run: {type(exc).__name__}: {exc}",
            )
        ]
        artifact = None
    return PrecheckReport(checks, artifact, started, time.time())
