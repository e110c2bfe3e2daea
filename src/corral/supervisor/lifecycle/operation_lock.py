"""The engine's operation lock: one runbook operation holds the engine at a time, from its PRECHECK
to its last step. `/v1/state` shows the holder as `busy`, and the operation in flight (kind, id,
runbook step, since when) as `operation`; the state stream sends one `operation` line per step."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# Told the operation in flight (`in_flight()`) on every change: a step begun, the lock released (None).
StepListener = Callable[[dict[str, Any] | None], None]


class EngineHeld(Exception):
    """Another operation holds the engine; the message names it."""


class OperationLock:
    """Not an `asyncio.Lock`: a second operation is refused at once (HTTP 409), never queued, and
    the lock passes from the request that ran PRECHECK to the task that runs the operation."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._holder: str | None = None
        self._operation: dict[str, Any] | None = None
        self._listeners: list[StepListener] = []

    @property
    def holder(self) -> str | None:
        return self._holder

    def take(self, holder: str, kind: str | None = None, detail: str | None = None) -> None:
        """Held from now on; with `kind`, the operation is in flight at its PRECHECK."""
        if self._holder is not None:
            raise EngineHeld(f"operation {self._holder} holds the engine; wait for it to finish")
        self._holder = holder
        if kind is not None:
            self._operation = {"kind": kind, "id": None, "detail": detail, "step": "precheck"}
            self._operation["since"] = self._clock()
            self._tell()

    def hand_over(self, holder: str) -> None:
        """The taker names itself again (the operation's id is known once it is accepted)."""
        assert self._holder is not None, "take() first"
        self._holder = holder

    def at_step(self, operation_id: str, step: str) -> None:
        """The operation holding the lock begins `step` (a runbook step's value, e.g. `drain_policy`)."""
        if self._operation is None or self._operation["step"] == step:
            return
        self._operation = {**self._operation, "id": operation_id, "step": step, "since": self._clock()}
        self._tell()

    def release(self) -> None:
        self._holder = None
        if self._operation is not None:
            self._operation = None
            self._tell()

    def in_flight(self) -> dict[str, Any] | None:
        """The operation holding the engine: `kind`, `id` (None during PRECHECK), `detail` (e.g.
        `level 1`), `step`, `since` (wall clock the step began); None when none holds it."""
        return dict(self._operation) if self._operation is not None else None

    def subscribe(self, listener: StepListener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: StepListener) -> None:
        self._listeners.remove(listener)

    def _tell(self) -> None:
        current = self.in_flight()
        for listener in list(self._listeners):
            listener(current)
