"""Starting a runbook operation: PRECHECK first (a refusal is a 409 with nothing changed), then the
runbook under the operation ledger (its steps under the engine's rank watch: `rank_guard.py`), so the
same operation id returns the same run. Every run ends
with its change record (`change_record.py`) in the result, next to the steps, failed or not; a
refusal leaves one (outcome refused) in the oplog only."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from corral.supervisor.lifecycle.operation_lock import EngineHeld
from corral.supervisor.lifecycle.operations import Operation
from corral.supervisor.runbook.change_record import ChangeWitness
from corral.supervisor.runbook.rank_guard import RankGuard
from corral.supervisor.runbook.template import Observer, Refused, Runbook, RunbookPlan

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess


async def start_operation(
    sup: EngineAccess,
    plan: RunbookPlan,
    op_id: str | None,
    observer: Observer | None = None,
    detail: str | None = None,
) -> tuple[Operation, bool]:
    """Raises `Refused` (PRECHECK) or `OperationConflict` (the id names another kind of operation).
    With an `observer`, PRECHECK also reads OBSERVE's baseline and the run ends with OBSERVE.
    `detail` says what was asked in a few words (`level 1`): shown with the operation's step."""
    if op_id is not None:
        existing = sup.operations.get(op_id)
        if existing is not None:
            return sup.operations.start(plan.kind, op_id, _never)  # same run, or a conflict
    lock = sup.operation_lock
    witness = ChangeWitness(sup, plan.kind)
    checking = time.monotonic()
    try:
        lock.take(f"{plan.kind} (precheck)", plan.kind, detail)
    except EngineHeld as exc:
        witness.refused(op_id, f"{plan.kind} refused: {exc}", checking)
        raise Refused(f"{plan.kind} refused: {exc}") from None
    try:
        evidence = await plan.precheck()
        if observer is not None:  # the engine's steady state before the change
            evidence["observe_baseline"] = await observer.baseline()
    except Refused as exc:
        lock.release()
        witness.refused(op_id, str(exc), checking)
        raise
    except BaseException:
        lock.release()
        raise

    async def body(op: Operation) -> dict[str, Any]:
        guard = RankGuard(sup)  # a rank lost during any step ends it, and RECOVER runs
        runbook = Runbook(plan, op.id, sup.oplog.append, sup.log, observer, on_step=lock.at_step, guard=guard)
        try:
            await witness.begin()
            try:
                result = await runbook.run(evidence, checking)
            except Exception as exc:  # a failed run keeps its steps and record in the result too
                record = await witness.close(op.id, runbook.steps, str(exc))
                op.result = {"steps": runbook.steps, "change_record": record.to_file()}
                raise
            record = await witness.close(op.id, runbook.steps)
            return {**result, "change_record": record.to_file()}
        finally:
            lock.release()

    op, started = sup.operations.start(plan.kind, op_id, body)
    lock.hand_over(f"{plan.kind} {op.id}")
    return op, started


async def _never(op: Operation) -> dict[str, Any]:
    raise AssertionError("an operation id seen before is never run again")
