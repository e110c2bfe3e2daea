"""The last runbook steps the router heard of, for the dashboard's "Recent events": one record each
time an engine's operation begins a step or ends, as its supervisor's state stream tells it.

Fed by the stream reader (every step reaches it, however short, whether or not a dashboard is open),
kept in a ring of `STEPS_KEPT`, and read whole with each `/v1/fleet`: the page shows the last 20
events of steps and routing exits together, so it never needs more than the last 20 of either.
A repeat of what the stream already said (a state line carrying the same operation, or the first
line after a reconnect) records nothing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.contracts.supervisor import OperationInFlight

STEPS_KEPT = 20


@dataclass(frozen=True, slots=True)
class OperationStep:
    """An engine's operation began `step`, or ended (`step` None, `ended` True)."""

    url: str
    name: str | None
    kind: str
    operation_id: str | None
    detail: str | None
    step: str | None
    at: float  # the router's wall clock when the line was read (exits are timed on the same clock)

    def as_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "name": self.name,
            "kind": self.kind,
            "id": self.operation_id,
            "detail": self.detail,
            "step": self.step,
            "ended": self.step is None,
            "at": self.at,
        }


def _same(a: OperationInFlight | None, b: OperationInFlight | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.kind, a.id, a.step, a.since) == (b.kind, b.id, b.step, b.since)


class OperationSteps:
    def __init__(self, kept: int = STEPS_KEPT, clock: Callable[[], float] = time.time) -> None:
        self._steps: deque[OperationStep] = deque(maxlen=kept)
        self._clock = clock

    def heard(
        self, url: str, name: str | None, before: OperationInFlight | None, now: OperationInFlight | None
    ) -> None:
        """The stream said `now` where it last said `before`: a step begun, an operation ended, or
        nothing new. An operation replaced by another without an end between records the new step."""
        if _same(before, now):
            return
        said = now or before
        assert said is not None  # both None is the same
        step = now.step if now is not None else None
        self._steps.append(OperationStep(url, name, said.kind, said.id, said.detail, step, self._clock()))

    def to_json(self) -> list[dict[str, Any]]:
        """Oldest first, like `left_routing`."""
        return [step.as_json() for step in self._steps]
