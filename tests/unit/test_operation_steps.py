"""The operation in flight as the supervisor publishes it: the lock says which runbook step an
operation is in, tells its listeners once per step (never more), and says nothing once released."""

from __future__ import annotations

from typing import Any

import pytest

from corral.supervisor.lifecycle.operation_lock import OperationLock
from corral.supervisor.runbook.template import OperationFailed, Runbook, Step
from tests.unit.test_runbook import Plan


def _locked(clock: list[float]) -> tuple[OperationLock, list[dict[str, Any] | None]]:
    lock = OperationLock(clock=lambda: clock[0])
    told: list[dict[str, Any] | None] = []
    lock.subscribe(told.append)
    return lock, told


async def test_each_step_is_told_once_in_order_then_the_end() -> None:
    clock = [100.0]
    lock, told = _locked(clock)
    lock.take("sleep (precheck)", "sleep", "level 1")
    assert lock.in_flight() == {
        "kind": "sleep",
        "id": None,
        "detail": "level 1",
        "step": "precheck",
        "since": 100.0,
    }

    def on_step(op_id: str, step: str) -> None:
        clock[0] += 1
        lock.at_step(op_id, step)
        lock.at_step(op_id, step)  # the same step again is no news

    await Runbook(Plan(), "op-1", lambda *a, **f: None, lambda _: None, on_step=on_step).run({})
    lock.release()
    steps = [t["step"] if t is not None else None for t in told]
    assert steps == [
        "precheck",
        "remove_from_routing",
        "drain_policy",
        "execute",
        "verify",
        "postcheck",
        None,
    ]
    assert all(t["id"] == "op-1" and t["detail"] == "level 1" for t in told[1:-1] if t is not None)
    assert [t["since"] for t in told[:-1] if t is not None] == [100.0, 101.0, 102.0, 103.0, 104.0, 105.0]
    assert lock.in_flight() is None and lock.holder is None


async def test_a_failed_step_shows_recover() -> None:
    lock, told = _locked([0.0])
    lock.take("test (precheck)", "test")
    with pytest.raises(OperationFailed):
        await Runbook(
            Plan(Step.EXECUTE), "op-2", lambda *a, **f: None, lambda _: None, on_step=lock.at_step
        ).run({})
    assert [t["step"] for t in told if t is not None][-2:] == ["execute", "recover"]


def test_a_lock_taken_without_an_operation_tells_nothing() -> None:
    lock, told = _locked([0.0])
    lock.take("switch_bundle op-1")
    lock.at_step("op-1", "execute")
    lock.release()
    assert told == [] and lock.in_flight() is None
