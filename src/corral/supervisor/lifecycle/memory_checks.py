"""VERIFY's memory decisions: over two NVML readings of the engine (`device_memory.py`), a sleep freed each
GPU down to the residue, a KV release freed the KV share and no more (the weights stay), a wake brought
it back; at READY, what the engine holds and its logged KV size against the memory budget; and the
record `/v1/state` shows. Where nothing can be read the verdict is `not_measured`, never `passed`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.engine.dev_api import EngineFigures
from corral.engine.kv_log import KV_SHORTFALL_TOLERANCE, EngineLogFigures, KvCapacity, kv_capacity
from corral.supervisor.lifecycle.device_memory import GIB, NVML, DeviceReading
from corral.supervisor.lifecycle.memory_defaults import DEFAULT_SLEEP_RESIDUE_GIB, DEFAULT_WAKE_TOLERANCE
from corral.supervisor.precheck.check import Outcome

ENGINE_METRICS = "engine_metrics"  # a verdict's figures from the engine itself (corral sim's gauges)
PASSED, FAILED, NOT_MEASURED = Outcome.PASSED.value, "failed", Outcome.NOT_MEASURED.value


@dataclass(frozen=True)
class MemoryThresholds:
    """The supervisor's `--sleep-residue-gib`, `--wake-tolerance` and KV shortfall tolerance."""

    sleep_residue_bytes: int = int(DEFAULT_SLEEP_RESIDUE_GIB * GIB)
    wake_tolerance: float = DEFAULT_WAKE_TOLERANCE
    kv_tolerance: float = KV_SHORTFALL_TOLERANCE

    @classmethod
    def from_flags(cls, sleep_residue_gib: float, wake_tolerance: float) -> MemoryThresholds:
        return cls(int(sleep_residue_gib * GIB), wake_tolerance)


@dataclass(frozen=True)
class MemoryVerdict:
    """One memory check of VERIFY: passed | failed | not_measured, why, and from what figures."""

    outcome: str
    reason: str
    source: str | None  # nvml | engine_metrics | None (nothing to read)
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.outcome == FAILED

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "reason": self.reason, "source": self.source, **self.evidence}


NO_SOURCE = (
    "not measured: the engine reports no memory figures and NVML is not available here "
    "(no driver or no nvidia-ml-py in the supervisor's environment)"
)


def not_measured(reason: str = NO_SOURCE, **evidence: Any) -> MemoryVerdict:
    return MemoryVerdict(NOT_MEASURED, reason, None, evidence)


def _scoped(verdict: MemoryVerdict, reading: DeviceReading) -> MemoryVerdict:
    """A verdict on whole GPUs says so: other processes on them counted too."""
    if reading.scope != "device":
        return verdict
    note = " (whole GPUs: NVML's PIDs are another namespace's, so other processes count too)"
    return dataclasses.replace(verdict, reason=verdict.reason + note)


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def _short(uuid: str) -> str:
    return uuid[:12]


def _nothing_held(before: DeviceReading) -> MemoryVerdict | None:
    if before.total_bytes > 0:
        return None
    return MemoryVerdict(
        NOT_MEASURED,
        f"not measured: NVML attributes no GPU memory to the engine's processes {list(before.pids)} "
        "(a CPU engine?)",
        NVML,
        {"before": before.to_json()},
    )


def _sleep_verdict(
    before: DeviceReading,
    after: DeviceReading,
    level: int,
    release_kv: bool,
    logged: EngineLogFigures | None,
    thresholds: MemoryThresholds,
) -> MemoryVerdict:
    empty = _nothing_held(before)
    if empty is not None:
        return empty
    evidence: dict[str, Any] = {"before": before.to_json(), "after": after.to_json()}
    tol = thresholds.wake_tolerance
    if level >= 1:
        residue = thresholds.sleep_residue_bytes
        held = [(g, after.gpus.get(g, 0)) for g in before.gpus if after.gpus.get(g, 0) > residue]
        if held:
            detail = ", ".join(f"{_short(g)} {_gib(h)} (before {_gib(before.gpus[g])})" for g, h in held)
            return MemoryVerdict(
                FAILED,
                f"sleep level {level} left {detail} held, above the {_gib(residue)} residue "
                "(--sleep-residue-gib)",
                NVML,
                evidence,
            )
        most = max((after.gpus.get(g, 0) for g in before.gpus), default=0)
        return MemoryVerdict(
            PASSED, f"freed to {_gib(most)} per GPU at most (residue {_gib(residue)})", NVML, evidence
        )
    if release_kv:
        kv = logged.kv_cache_bytes if logged is not None else None
        if kv is None:
            return MemoryVerdict(
                NOT_MEASURED,
                "not measured: the KV share is unknown (the engine logged no 'Available KV cache "
                "memory' line)",
                NVML,
                evidence,
            )
        freed = {g: before.gpus[g] - after.gpus.get(g, 0) for g in before.gpus}
        short = [g for g in before.gpus if freed[g] < kv * (1 - tol)]
        if short:
            detail = ", ".join(f"{_short(g)} freed {_gib(freed[g])}" for g in short)
            return MemoryVerdict(
                FAILED, f"the KV cache's GPU memory was not released: {detail} of {_gib(kv)}", NVML, evidence
            )
        # the weights stay: no GPU may free more than the KV share (the tolerance of what it held)
        over = [g for g in before.gpus if freed[g] > kv + before.gpus[g] * tol]
        if over:
            detail = ", ".join(f"{_short(g)} freed {_gib(freed[g])}" for g in over)
            return MemoryVerdict(
                FAILED,
                f"a KV release must keep the weights resident: {detail}, more than the KV share "
                f"{_gib(kv)} (tolerance {tol:.0%}, --wake-tolerance)",
                NVML,
                evidence,
            )
        return MemoryVerdict(
            PASSED, f"freed the KV share ({_gib(kv)} per GPU) and no more: the weights stayed", NVML, evidence
        )
    dropped = [g for g in before.gpus if after.gpus.get(g, 0) < before.gpus[g] * (1 - tol)]
    if dropped:
        return MemoryVerdict(
            FAILED, "a level-0 pause must keep the weights resident", NVML, evidence | {"dropped": dropped}
        )
    return MemoryVerdict(PASSED, "every allocation resident", NVML, evidence)


def sleep_verdict(
    before: DeviceReading,
    after: DeviceReading,
    level: int,
    release_kv: bool,
    logged: EngineLogFigures | None,
    thresholds: MemoryThresholds,
) -> MemoryVerdict:
    """After `/sleep` (and `/release_kv_cache_memory`): level 1/2 freed each GPU down to the residue,
    a KV release freed the KV share and no more (the weights resident), a level-0 pause kept everything
    resident."""
    return _scoped(_sleep_verdict(before, after, level, release_kv, logged, thresholds), before)


def wake_verdict(
    before: DeviceReading,
    after: DeviceReading,
    still_asleep: list[str],
    logged: EngineLogFigures | None,
    thresholds: MemoryThresholds,
) -> MemoryVerdict:
    return _scoped(_wake_verdict(before, after, still_asleep, logged, thresholds), before)


_SHARE = {"weights": "weights_bytes", "kv_cache": "kv_cache_bytes"}


def _wake_verdict(
    before: DeviceReading,
    after: DeviceReading,
    still_asleep: list[str],
    logged: EngineLogFigures | None,
    thresholds: MemoryThresholds,
) -> MemoryVerdict:
    """After a wake or reload: each GPU back to within the tolerance of what it held before the sleep,
    less the shares of the tags still asleep (a partial wake)."""
    empty = _nothing_held(before)
    if empty is not None:
        return empty
    evidence: dict[str, Any] = {"before": before.to_json(), "after": after.to_json()}
    asleep_share = 0
    for tag in still_asleep:
        share = getattr(logged, _SHARE[tag]) if logged is not None and tag in _SHARE else None
        if share is None:
            return MemoryVerdict(
                NOT_MEASURED,
                f"not measured: the {tag} share is unknown (not in the engine's startup log), so a "
                "partial wake's memory cannot be told from a full one",
                NVML,
                evidence,
            )
        asleep_share += share
    tol = thresholds.wake_tolerance
    problems: list[str] = []
    for g, held_before in before.gpus.items():
        want, got, slack = held_before - asleep_share, after.gpus.get(g, 0), held_before * tol
        if got < want - slack:
            problems.append(f"{_short(g)} holds {_gib(got)}, below the {_gib(want)} expected")
        elif still_asleep and got > want + slack:
            problems.append(f"{_short(g)} holds {_gib(got)}: {still_asleep} should still be freed")
    if problems:
        return MemoryVerdict(
            FAILED, "; ".join(problems) + f" (tolerance {tol:.0%}, --wake-tolerance)", NVML, evidence
        )
    what = "back to within" if not still_asleep else f"{still_asleep} still freed, the rest within"
    return MemoryVerdict(PASSED, f"{what} {tol:.0%} of before the sleep", NVML, evidence)


def reported(figures: EngineFigures | None) -> bool:
    """Whether the engine's /metrics reports its GPU memory (`corral sim` does; vLLM does not)."""
    return figures is not None and figures.gpu_weights_bytes is not None


def resident_verdict(figures: EngineFigures | None, reading: DeviceReading | None) -> MemoryVerdict:
    """At READY: what the engine holds, from its own figures or else NVML."""
    if figures is not None and reported(figures):
        kv = figures.gpu_kv_cache_bytes or 0.0
        return MemoryVerdict(
            PASSED,
            f"resident: weights {_gib(figures.gpu_weights_bytes or 0.0)}, KV cache {_gib(kv)}",
            ENGINE_METRICS,
            {"figures": figures.to_json()},
        )
    if reading is None:
        return not_measured()
    empty = _nothing_held(reading)
    if empty is not None:
        return empty
    per_gpu = ", ".join(f"{_short(g)} {_gib(h)}" for g, h in reading.gpus.items())
    resident = MemoryVerdict(PASSED, f"resident: {per_gpu}", NVML, {"reading": reading.to_json()})
    return _scoped(resident, reading)


def budget_evidence(report: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The memory budget check's evidence in a PRECHECK report's JSON (None: no budget was made)."""
    for check in (report or {}).get("checks") or []:
        if isinstance(check, Mapping) and check.get("name") == "memory_budget":
            evidence = check.get("evidence")
            return evidence if isinstance(evidence, Mapping) else None
    return None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def capacity_at_ready(
    logged: EngineLogFigures, budget: Mapping[str, Any] | None, thresholds: MemoryThresholds
) -> KvCapacity:
    """vLLM's logged KV size against the budget's `expected_kv_tokens` and `min_kv_tokens`."""
    budget = budget or {}
    return kv_capacity(
        logged.kv_cache_tokens,
        _int(budget.get("expected_kv_tokens")),
        _int(budget.get("min_kv_tokens")),
        thresholds.kv_tolerance,
    )


class MemoryRecord:
    """What `/v1/state` shows as `memory`: the last memory verdict (at READY, or of the last sleep,
    wake or reload) and the KV capacity check of the running engine."""

    def __init__(self) -> None:
        self.last: dict[str, Any] | None = None
        self.kv_capacity: KvCapacity | None = None
        self.logged: dict[str, Any] | None = None

    def note(self, operation: str, verdict: MemoryVerdict) -> dict[str, Any]:
        self.last = {"operation": operation, "at": time.time(), **verdict.to_json()}
        return self.last

    def note_capacity(self, capacity: KvCapacity, logged: EngineLogFigures) -> None:
        self.kv_capacity = capacity
        self.logged = logged.to_json()

    def to_json(self) -> dict[str, Any]:
        return {
            "last": self.last,
            "kv_capacity": self.kv_capacity.to_json() if self.kv_capacity is not None else None,
            "logged": self.logged,
        }
