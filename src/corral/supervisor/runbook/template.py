"""The runbook's operation template as code: PRECHECK → REMOVE FROM ROUTING → DRAIN/POLICY → EXECUTE →
VERIFY → POSTCHECK, with RECOVER/ROLLBACK run on any failure. A `RunbookPlan` supplies the steps;
`Runbook.run` runs every one of them in this order (a plan cannot leave one out: a step that does
not apply returns why, and that is recorded too) and writes each step's start, outcome and evidence
to the operation log as a `runbook_step` record.

PRECHECK runs before the operation is accepted, so a refused operation (`Refused`, HTTP 409) has
changed nothing; its evidence is recorded as the first step once the operation runs. Asked for, an
`Observer` closes the operation with OBSERVE, a window of traffic after POSTCHECK.

Given a `StepGuard` (the engine's rank watch: `runbook/rank_guard.py`), every step from REMOVE FROM
ROUTING to OBSERVE runs against it: a rank lost while a step runs ends the step at once with
`RankLost`, and RECOVER runs, whichever step it was (POSTCHECK and OBSERVE included: an engine that
lost a rank is in no state to be left as it is).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any, Protocol

Record = Callable[..., Any]  # OperationLog.append(record_type, **fields)
Log = Callable[[str], None]
OnStep = Callable[[str, str], None]  # (operation id, step value) as each step begins
Evidence = dict[str, Any]


class Step(StrEnum):
    PRECHECK = "precheck"
    REMOVE_FROM_ROUTING = "remove_from_routing"
    DRAIN_POLICY = "drain_policy"
    EXECUTE = "execute"
    VERIFY = "verify"
    RECOVER = "recover"
    POSTCHECK = "postcheck"
    OBSERVE = "observe"  # after POSTCHECK, only when asked (`observe.py`); not in ORDER


ORDER = (Step.REMOVE_FROM_ROUTING, Step.DRAIN_POLICY, Step.EXECUTE, Step.VERIFY)


class Refused(Exception):
    """A precondition does not hold: the operation is not started and nothing changed (HTTP 409)."""


class StepFailed(Exception):
    """A step found that the operation cannot go on; `evidence` is what it saw."""

    def __init__(self, message: str, **evidence: Any) -> None:
        super().__init__(message)
        self.evidence = evidence


class RankLost(StepFailed):
    """A rank of the engine was lost while a step ran (or a step found one lost): RECOVER runs, at any
    step; the evidence is the rank watch's (`source: rank_watch`, `rank`, `kind`, every rank)."""


class StepGuard(Protocol):
    """Ends a running step when the engine can no longer go on: `broken()` returns that failure once
    there is one (at once when there is one already), and never returns otherwise."""

    async def broken(self) -> StepFailed: ...


class OperationFailed(Exception):
    """The operation failed at `step` and RECOVER ran; the message names both."""

    def __init__(self, kind: str, step: Step, cause: str, recovered: Evidence) -> None:
        super().__init__(f"{kind} failed at {step}: {cause}; recover: {recovered.get('outcome', '?')}")
        self.step = step
        self.cause = cause
        self.recovered = recovered


class RunbookPlan(Protocol):
    kind: str

    async def precheck(self) -> Evidence: ...
    async def remove_from_routing(self) -> Evidence: ...
    async def drain(self) -> Evidence: ...
    async def execute(self) -> Evidence: ...
    async def verify(self) -> Evidence: ...
    async def recover(self, failed_step: Step, cause: str) -> Evidence: ...
    async def postcheck(self) -> Evidence: ...


class Observer(Protocol):
    """OBSERVE (`runbook/observe.py`): a baseline read at PRECHECK, a window after POSTCHECK that
    raises StepFailed when it is worse; `recovers` when that failure runs the plan's RECOVER."""

    recovers: bool

    async def baseline(self) -> Evidence: ...
    async def observe(self) -> Evidence: ...


class Runbook:
    """Runs one plan under one operation id, recording every step."""

    def __init__(
        self,
        plan: RunbookPlan,
        operation_id: str,
        record: Record,
        log: Log,
        observer: Observer | None = None,
        on_step: OnStep | None = None,
        guard: StepGuard | None = None,
    ) -> None:
        self.plan = plan
        self.guard = guard
        self.observer = observer
        self.operation_id = operation_id
        self._record = record
        self._log = log
        self._on_step = on_step
        self.steps: list[dict[str, Any]] = []

    def _begin(self, step: Step) -> float:
        if self._on_step is not None:
            self._on_step(self.operation_id, step.value)
        return time.monotonic()

    def _note(self, step: Step, status: str, evidence: Evidence, started: float) -> None:
        seconds = time.monotonic() - started  # `started` is monotonic; the record shows wall clock
        entry = {
            "step": step.value,
            "status": status,
            "started": round(time.time() - seconds, 4),
            "seconds": round(seconds, 4),
            "evidence": evidence,
        }
        self.steps.append(entry)
        self._record("runbook_step", operation_id=self.operation_id, kind=self.plan.kind, **entry)
        self._log(f"{self.plan.kind} {self.operation_id}: {step} {status}")

    async def _step(self, step: Step, body: Callable[[], Awaitable[Evidence]]) -> None:
        started = self._begin(step)
        try:
            evidence = await self._guarded(body)
        except StepFailed as exc:
            self._note(step, "failed", {"error": str(exc), **exc.evidence}, started)
            raise
        except Exception as exc:
            self._note(step, "failed", {"error": f"{type(exc).__name__}: {exc}"}, started)
            raise StepFailed(f"{type(exc).__name__}: {exc}") from exc
        self._note(step, "done", evidence, started)

    async def _guarded(self, body: Callable[[], Awaitable[Evidence]]) -> Evidence:
        """The step's body, ended by the guard's failure when that comes first (or at the same time)."""
        if self.guard is None:
            return await body()
        work = asyncio.ensure_future(body())
        watch = asyncio.ensure_future(self.guard.broken())
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, watch):
                task.cancel()
            await asyncio.gather(work, watch, return_exceptions=True)
        if watch.done() and not watch.cancelled() and watch.exception() is None:
            raise watch.result()
        return work.result()

    async def run(self, precheck_evidence: Evidence, precheck_started: float | None = None) -> dict[str, Any]:
        """Every step in order; on a failure RECOVER runs and `OperationFailed` is raised.
        `precheck_started` is when PRECHECK began (monotonic), which ran before the operation did."""
        self._note(Step.PRECHECK, "done", precheck_evidence, precheck_started or time.monotonic())
        bodies = {
            Step.REMOVE_FROM_ROUTING: self.plan.remove_from_routing,
            Step.DRAIN_POLICY: self.plan.drain,
            Step.EXECUTE: self.plan.execute,
            Step.VERIFY: self.plan.verify,
        }
        for step in ORDER:
            try:
                await self._step(step, bodies[step])
            except StepFailed as exc:
                await self._recover(step, str(exc))
        try:
            await self._step(Step.POSTCHECK, self.plan.postcheck)
        except RankLost as exc:
            await self._recover(Step.POSTCHECK, str(exc))
        if self.observer is not None:
            await self._observe(self.observer)
        return {"steps": self.steps}

    async def _observe(self, observer: Observer) -> None:
        """A failed window fails the operation (the step's error names the figures); RECOVER runs
        first where the observer says so."""
        try:
            await self._step(Step.OBSERVE, observer.observe)
        except StepFailed as exc:
            if observer.recovers or isinstance(exc, RankLost):
                await self._recover(Step.OBSERVE, str(exc))
            raise

    async def _recover(self, failed_step: Step, cause: str) -> None:
        started = self._begin(Step.RECOVER)
        try:
            recovered = await self.plan.recover(failed_step, cause)
            status = "done"
        except Exception as exc:
            recovered = {"outcome": f"recover itself failed: {type(exc).__name__}: {exc}"}
            status = "failed"
        self._note(
            Step.RECOVER, status, {"failed_step": failed_step.value, "cause": cause, **recovered}, started
        )
        raise OperationFailed(self.plan.kind, failed_step, cause, recovered)
