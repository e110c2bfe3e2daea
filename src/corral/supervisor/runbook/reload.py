"""`POST /v1/reload`: reload the weights from their checkpoint without restarting the process, the
runbook's level-2 path: out of routing, drain, sleep level 2, wake weights, `reload_weights` (read per
rank), wake the KV cache, then VERIFY: awake, memory back, the model listed and a smoke that is a real
completion of it, the bundle fingerprint read again (from → to), startup's KV-capacity check repeated.
Any failure makes the engine FAILED (naming the rank where one failed) and restarts it in place, so a
serving engine never runs on weights that are not known to be whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.engine.dev_api import EngineFigures
from corral.supervisor.lifecycle.device_memory import DeviceReading
from corral.supervisor.lifecycle.drain import Leaving
from corral.supervisor.lifecycle.sleep_status import SleepStatus
from corral.supervisor.lifecycle.states import EngineState
from corral.supervisor.runbook.cleanup import postcheck_leftovers
from corral.supervisor.runbook.common import (
    SLEEP_MODES,
    admin_for,
    apply_policy,
    device_reading,
    fail_and_restart,
    leave_routing,
    require_ready_and_dev,
    require_sleep_mode,
    verify_awake,
)
from corral.supervisor.runbook.prefix_reset import prefix_state_after
from corral.supervisor.runbook.reload_checks import (
    files_digest,
    identity_after,
    kv_capacity_after,
    reload_every_rank,
)
from corral.supervisor.runbook.template import Evidence, Refused, Step, StepFailed

if TYPE_CHECKING:
    from corral.supervisor.checks.bundle import Bundle
    from corral.supervisor.runbook.engine_access import EngineAccess

S = EngineState


class ReloadPlan:
    kind = "reload"

    def __init__(self, sup: EngineAccess, mode: str = "wait") -> None:
        if mode not in SLEEP_MODES:
            raise Refused(f"mode {mode!r}: use wait, abort or keep")
        self.sup = sup
        self.mode = mode
        self.admin = admin_for(sup)
        self.before: EngineFigures | None = None
        self.device_before: DeviceReading | None = None  # NVML, where the engine reports no figures
        self._drainer: Leaving | None = None
        self.bundle_before: Bundle | None = None  # the fingerprint the reload changes from
        self.files_at_call: dict[str, Any] | None = None  # the model files as reload_weights read them

    async def precheck(self) -> Evidence:
        evidence = await require_ready_and_dev(self.sup, self.admin, "reload")
        evidence.update(require_sleep_mode(self.sup, "reload"))
        self.before = await self.admin.figures()
        evidence["before"] = self.before.to_json()
        self.bundle_before = self.sup.bundle
        evidence["fingerprint_before"] = self.bundle_before.fingerprint if self.bundle_before else None
        self.device_before = await device_reading(self.sup, self.before)
        if self.device_before is not None:
            evidence["device_before"] = self.device_before.to_json()
        return evidence

    async def remove_from_routing(self) -> Evidence:
        self._drainer, evidence = await leave_routing(
            self.sup, "weight reload: readiness withdrawn", self.mode
        )
        return evidence

    async def drain(self) -> Evidence:
        assert self._drainer is not None
        return await apply_policy(self.sup, self._drainer, self.mode)

    async def execute(self) -> Evidence:
        calls: list[Evidence] = [{"sleep level 2": await self.admin.sleep(2, self.mode)}]
        self.sup.note_sleep(SleepStatus(level=2, mode=self.mode, kv_released=False, reloading=True))
        self.sup.transition(S.SLEEPING, "weight reload: level-2 sleep, weights discarded", "level_2")
        self.sup.transition(S.WAKING, "weight reload: weights → reload_weights → kv_cache", "reloading")
        calls.append({"wake_up weights": await self.admin.wake_up(["weights"])})
        self.files_at_call = await files_digest(self.sup)
        calls.append({"reload_weights": await reload_every_rank(self.sup, self.admin)})
        calls.append({"wake_up kv_cache": await self.admin.wake_up(["kv_cache"])})
        calls.append({"wake_up": await self.admin.wake_up()})
        return {"calls": calls}

    async def verify(self) -> Evidence:
        checked = await verify_awake(self.sup, self.admin, self.before, self.device_before, self.kind)
        checked["identity"] = await identity_after(self.sup, self.bundle_before, self.files_at_call)
        checked["kv_capacity"] = kv_capacity_after(self.sup)
        checked["prefix_cache"] = await prefix_state_after(self.sup, self.admin, self.before, "reload")
        self.sup.note_sleep(None)
        fingerprint = checked["identity"]["fingerprint"]
        self.sup.transition(
            S.READY,
            "weights reloaded: every rank, model listed, smoke completion answered, "
            f"bundle {fingerprint['from']} → {fingerprint['to']}",
            None,
            bundle=fingerprint["to"],
            kv_capacity=checked["kv_capacity"]["outcome"],
            **checked["smoke"],
        )
        self.sup.resume_serving()
        return checked

    async def recover(self, failed_step: Step, cause: str) -> Evidence:
        return await fail_and_restart(self.sup, f"reload failed at {failed_step}: {cause}")

    async def postcheck(self) -> Evidence:
        if self.sup.machine.state is not S.READY:
            raise StepFailed(f"state {self.sup.machine.state} after the reload")
        figures = await self.admin.figures()
        leftovers = await postcheck_leftovers(
            self.sup, self.kind, awake=True, cpu_backup_bytes=figures.cpu_backup_bytes
        )
        return {"state": "READY", "leftovers": leftovers}
