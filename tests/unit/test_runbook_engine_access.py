"""The seam between the runbook operations and the supervisor: the typed sleep status (shown in
`/v1/state` exactly as the operations' dicts were), the operation lock (one operation at a time,
refused never queued), and `start_operation` taking and releasing that lock around PRECHECK and the
run."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from corral.bundle_spec import BundleSpec
from corral.supervisor.checks.adapters import AdapterSet
from corral.supervisor.lifecycle.config import SupervisorConfig
from corral.supervisor.lifecycle.operation_lock import EngineHeld, OperationLock
from corral.supervisor.lifecycle.operations import OperationLedger
from corral.supervisor.lifecycle.sleep_status import SleepStatus
from corral.supervisor.runbook.engine_access import EngineAccess
from corral.supervisor.runbook.run import start_operation
from corral.supervisor.runbook.template import Refused, StepFailed


def test_sleep_status_shows_as_the_sleep_operation_wrote_it() -> None:
    status = SleepStatus(level=1, mode="wait", kv_released=False, before={"gpu_weights_bytes": 10.0})
    assert status.to_json() == {
        "level": 1,
        "mode": "wait",
        "kv_released": False,
        "before": {"gpu_weights_bytes": 10.0},
    }
    assert SleepStatus(level=0, mode="keep", kv_released=True).to_json()["before"] is None


def test_a_reload_sleep_shows_reloading_and_no_before() -> None:
    status = SleepStatus(level=2, mode="abort", kv_released=False, reloading=True)
    assert status.to_json() == {"level": 2, "mode": "abort", "kv_released": False, "reloading": True}


def test_a_partial_wake_adds_the_tags_and_keeps_the_rest() -> None:
    asleep = SleepStatus(level=1, mode="wait", kv_released=False, before=None)
    partly = asleep.partially_awake(["weights"], ["kv_cache"])
    assert partly.to_json() == {**asleep.to_json(), "woken_tags": ["weights"], "asleep_tags": ["kv_cache"]}
    assert asleep.woken_tags is None  # frozen: the earlier status is unchanged


def test_the_lock_refuses_a_second_taker_until_released() -> None:
    lock = OperationLock()
    lock.take("sleep (precheck)")
    lock.hand_over("sleep op-1")
    with pytest.raises(EngineHeld, match="operation sleep op-1 holds the engine"):
        lock.take("wake (precheck)")
    assert lock.holder == "sleep op-1"
    lock.release()
    lock.take("wake (precheck)")
    assert lock.holder == "wake (precheck)"


class _Records:
    def __init__(self) -> None:
        self.types: list[str] = []

    def append(self, record_type: str, /, **fields: Any) -> None:
        self.types.append(record_type)


class _Engine:
    """The part of `EngineAccess` that `start_operation` uses, with the real lock and ledger; no
    engine process and no admission gate (what its change record reads)."""

    def __init__(self) -> None:
        self.operation_lock = OperationLock()
        self.operations = OperationLedger(lambda op: None)
        self.oplog = _Records()
        self.config = SupervisorConfig(engine_argv=())
        self.gate = None
        self.engine = None
        self.bundle = None
        self.running_bundle = BundleSpec(name="initial")
        self.sleep_status = None
        self.adapters = AdapterSet()
        self.record_traces = None  # no traces exported

    def log(self, message: str) -> None:
        pass


class _Plan:
    """A plan whose EXECUTE waits for `go`, so the test sees the lock held while it runs."""

    kind = "sleep"

    def __init__(self, refuse: bool = False, kind: str = "sleep") -> None:
        self.kind = kind
        self.refuse = refuse
        self.go = asyncio.Event()

    async def precheck(self) -> dict[str, Any]:
        if self.refuse:
            raise Refused("sleep refused: not READY")
        return {}

    async def remove_from_routing(self) -> dict[str, Any]:
        return {}

    async def drain(self) -> dict[str, Any]:
        return {}

    async def execute(self) -> dict[str, Any]:
        await self.go.wait()
        return {}

    async def verify(self) -> dict[str, Any]:
        return {}

    async def recover(self, failed_step: Any, cause: str) -> dict[str, Any]:
        raise StepFailed("not reached")

    async def postcheck(self) -> dict[str, Any]:
        return {}


async def test_an_operation_holds_the_lock_from_precheck_to_its_end() -> None:
    engine = _Engine()
    plan = _Plan()
    op, started = await start_operation(cast(EngineAccess, engine), plan, None)
    assert started and engine.operation_lock.holder == f"sleep {op.id}"
    with pytest.raises(Refused, match=f"wake refused: operation sleep {op.id} holds the engine"):
        await start_operation(cast(EngineAccess, engine), _Plan(kind="wake"), None)
    plan.go.set()
    await op.done.wait()
    assert op.status == "succeeded" and engine.operation_lock.holder is None
    assert "runbook_step" in engine.oplog.types and engine.oplog.types[-1] == "change_record"
    assert op.result is not None and op.result["change_record"]["outcome"] == "succeeded"


async def test_a_refused_precheck_leaves_the_lock_free() -> None:
    engine = _Engine()
    with pytest.raises(Refused):
        await start_operation(cast(EngineAccess, engine), _Plan(refuse=True), None)
    assert engine.operation_lock.holder is None
    assert engine.oplog.types == ["change_record"]  # the refusal's record (outcome refused)
