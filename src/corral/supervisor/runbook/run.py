"""Starting a runbook operation: PRECHECK first (a refusal is a 409 with nothing changed), then the
runbook under the operation ledger, so the same operation id returns the same run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.supervisor.lifecycle.operation_lock import EngineHeld
from corral.supervisor.lifecycle.operations import Operation
from corral.supervisor.runbook.template import Refused, Runbook, RunbookPlan

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess


async def start_operation(sup: EngineAccess, plan: RunbookPlan, op_id: str | None) -> tuple[Operation, bool]:
    """Raises `Refused` (PRECHECK) or `OperationConflict` (the id names another kind of operation)."""
    if op_id is not None:
        existing = sup.operations.get(op_id)
        if existing is not None:
            return sup.operations.start(plan.kind, op_id, _never)  # same run, or a conflict
    lock = sup.operation_lock
    try:
        lock.take(f"{plan.kind} (precheck)")
    except EngineHeld as exc:
        raise Refused(f"{plan.kind} refused: {exc}") from None
    try:
        evidence = await plan.precheck()
    except BaseException:
        lock.release()
        raise

    async def body(op: Operation) -> dict[str, Any]:
        try:
            return await Runbook(plan, op.id, sup.oplog.append, sup.log).run(evidence)
        finally:
            lock.release()

    op, started = sup.operations.start(plan.kind, op_id, body)
    lock.hand_over(f"{plan.kind} {op.id}")
    return op, started


async def _never(op: Operation) -> dict[str, Any]:
    raise AssertionError("an operation id seen before is never run again")
