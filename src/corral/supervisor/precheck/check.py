"""One PRECHECK check's result: what was checked, its outcome, one line an operator reads, and the
evidence behind it. A start is authorized only when no check is refused."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Outcome(StrEnum):
    PASSED = "passed"
    REFUSED = "refused"  # the start is not authorized
    NOT_MEASURED = "not_measured"  # nothing to read it from here (no NVML, a hub id): never "passed"
    SKIPPED = "skipped"  # does not apply to this engine (no preload daemon, …)


@dataclass(frozen=True)
class CheckResult:
    name: str  # artifact_identity, parallel_identity, memory_budget, environment, preload
    outcome: Outcome
    reason: str  # one line: what passed, or what does not fit and by how much, and what to do
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def refused(self) -> bool:
        return self.outcome is Outcome.REFUSED

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "evidence": self.evidence,
        }
