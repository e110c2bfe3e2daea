"""`POST /v1/sleep {level, mode, release_kv}`: put a READY engine to sleep the runbook's way.

Level 0 pauses scheduling with every allocation resident (with `release_kv`, the KV cache is then
freed, which needs the level-0 keep pause); level 1 offloads the weights to host memory and drops the
KV cache; level 2 drops both. VERIFY reads `/is_sleeping`, `vllm:engine_sleep_state` and the memory
figures (the engine's, or NVML's over its processes: `lifecycle/device_memory.py`; "not measured"
without either); a KV release must also keep the weights resident (vLLM's sleep-state gauge names
no offload or discard; the engine's figures or NVML show the weights held), and VERIFY and POSTCHECK
require every rank seen and alive (the API process alone says nothing of its workers). A failure
before the sleep holds wakes the engine and makes it READY again, on a new prefix epoch where the
sleep may have emptied the prefix cache; a rank lost at any step fails the engine (FAILED naming the
rank) and restarts it in place, since no wake brings a rank back.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from corral.engine.dev_api import EngineFigures
from corral.engine.metric_names import SLEEP_STATE
from corral.supervisor.lifecycle.device_memory import DeviceReading
from corral.supervisor.lifecycle.drain import Leaving
from corral.supervisor.lifecycle.memory_checks import sleep_verdict
from corral.supervisor.lifecycle.sleep_status import SleepStatus
from corral.supervisor.lifecycle.states import EngineState
from corral.supervisor.runbook.common import (
    SLEEP_MODES,
    admin_for,
    apply_policy,
    back_to_ready,
    device_reading,
    device_verdict,
    figures_failed,
    figures_passed,
    leave_routing,
    logged_figures,
    require_ready_and_dev,
    require_sleep_mode,
)
from corral.supervisor.runbook.host_ram import host_ram_for_backup
from corral.supervisor.runbook.rank_guard import ranks_whole
from corral.supervisor.runbook.template import Evidence, Refused, Step, StepFailed

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess

S = EngineState
EXPECTED_SLEEP_STATE = {0: None, 1: "weights_offloaded", 2: "discard_all"}


class SleepPlan:
    kind = "sleep"

    def __init__(
        self, sup: EngineAccess, level: int, mode: str, release_kv: bool = False, reason: str | None = None
    ) -> None:
        if level not in (0, 1, 2):
            raise Refused(f"sleep level {level!r}: use 0, 1 or 2")
        if mode not in SLEEP_MODES:
            raise Refused(f"sleep mode {mode!r}: use wait, abort or keep")
        if release_kv and (level != 0 or mode != "keep"):
            raise Refused(
                "release_kv needs a level-0 keep pause (level 0, mode keep): it frees only the KV cache"
            )
        self.sup = sup
        self.level = level
        self.mode = mode
        self.release_kv = release_kv
        self.reason = reason  # why the supervisor chose this sleep (idle_sleep.py); None: asked for
        self.admin = admin_for(sup)
        self.before: EngineFigures | None = None
        self.device_before: DeviceReading | None = None  # NVML, where the engine reports no figures
        self._drainer: Leaving | None = None
        self._prefix_cache_wiped = False  # set once EXECUTE asked for a sleep that empties it

    async def precheck(self) -> Evidence:
        evidence = await require_ready_and_dev(self.sup, self.admin, "sleep")
        if self.level >= 1 or self.release_kv:
            evidence.update(require_sleep_mode(self.sup, "sleep"))
        self.before = await self.admin.figures()
        if self.level == 1:
            evidence["host_ram"] = await asyncio.to_thread(host_ram_for_backup, self.sup, self.before)
        evidence["before"] = self.before.to_json()
        self.device_before = await device_reading(self.sup, self.before)
        if self.device_before is not None:
            evidence["device_before"] = self.device_before.to_json()
        return evidence

    async def remove_from_routing(self) -> Evidence:
        what = f"sleep level {self.level}" + (" and KV release" if self.release_kv else "")
        self._drainer, evidence = await leave_routing(self.sup, f"{what}: readiness withdrawn", self.mode)
        return evidence

    async def drain(self) -> Evidence:
        assert self._drainer is not None
        return await apply_policy(self.sup, self._drainer, self.mode)

    async def execute(self) -> Evidence:
        # from here a failed sleep may have emptied the prefix cache (vLLM clears it at level >= 1 and
        # on a KV release), so RECOVER's way back to READY moves the prefix epoch
        self._prefix_cache_wiped = self.level >= 1 or self.release_kv
        answer = await self.admin.sleep(self.level, self.mode)
        evidence: Evidence = {"sleep": answer}
        if self.release_kv:
            evidence["release_kv_cache_memory"] = await self.admin.release_kv_cache()
        return evidence

    async def verify(self) -> Evidence:
        ranks = ranks_whole(self.sup, "sleep VERIFY")  # the seed: the process and every rank alive
        if not await self.admin.is_sleeping():
            raise StepFailed("/is_sleeping is false after /sleep")
        after = await self.admin.figures()
        want = EXPECTED_SLEEP_STATE[self.level]
        if after.sleep_state != want:
            # vLLM sets the gauge from the calls it served: at level 0 (and after a KV release) it names
            # no sleep state; one that names an offload or a discard says the weights left the GPU
            left = " (the weights left the GPU)" if self.level == 0 and after.sleep_state != "awake" else ""
            raise StepFailed(
                f"{SLEEP_STATE} is {after.sleep_state}, expected {want}{left}", after=after.to_json()
            )
        before = self.before
        moved: Evidence = {}
        if (
            before is not None
            and after.gpu_weights_bytes is not None
            and before.gpu_weights_bytes is not None
        ):
            moved = {
                "gpu_weights_bytes": [before.gpu_weights_bytes, after.gpu_weights_bytes],
                "gpu_kv_cache_bytes": [before.gpu_kv_cache_bytes, after.gpu_kv_cache_bytes],
                "cpu_backup_bytes": [before.cpu_backup_bytes, after.cpu_backup_bytes],
            }
            if self.level >= 1 and (after.gpu_weights_bytes or after.gpu_kv_cache_bytes):
                raise figures_failed(
                    self.sup,
                    self.kind,
                    "sleep did not free the weights' and KV cache's GPU memory",
                    moved=moved,
                )
            if self.level == 1 and (after.cpu_backup_bytes or 0) < before.gpu_weights_bytes:
                raise figures_failed(
                    self.sup, self.kind, "host memory did not take the weights' backup", moved=moved
                )
            if self.release_kv and after.gpu_kv_cache_bytes:
                raise figures_failed(
                    self.sup, self.kind, "the KV cache's GPU memory was not released", moved=moved
                )
            if self.level == 0 and after.gpu_weights_bytes < before.gpu_weights_bytes:
                what = "a KV release" if self.release_kv else "a level-0 pause"
                raise figures_failed(
                    self.sup, self.kind, f"{what} must keep the weights resident", moved=moved
                )
            moved = figures_passed(self.sup, self.kind, moved)
        else:
            level, release_kv, logged = self.level, self.release_kv, logged_figures(self.sup)
            thresholds = self.sup.config.memory
            moved = device_verdict(
                self.sup,
                self.kind,
                self.device_before,
                await device_reading(self.sup, after),
                lambda b, a: sleep_verdict(b, a, level, release_kv, logged, thresholds),
            )
        self.sup.note_sleep(
            SleepStatus(
                level=self.level,
                mode=self.mode,
                kv_released=self.release_kv,
                before=before.to_json() if before is not None else None,
                device_before=self.device_before.to_json() if self.device_before is not None else None,
                reason=self.reason,
            )
        )
        self.sup.transition(
            S.SLEEPING,
            f"asleep at level {self.level} (mode {self.mode})"
            + (", KV cache released" if self.release_kv else "")
            + (f": {self.reason}" if self.reason else ""),
            f"level_{self.level}",
            sleep_state=after.sleep_state,
            figures=after.to_json(),
        )
        return {"is_sleeping": True, "sleep_state": after.sleep_state, "memory": moved, "ranks": ranks}

    async def recover(self, failed_step: Step, cause: str) -> Evidence:
        return await back_to_ready(
            self.sup,
            self.admin,
            f"sleep abandoned at {failed_step}: awake again",
            cause,
            prefix_cache_wiped=self._prefix_cache_wiped,
            before=self.before,
        )

    async def postcheck(self) -> Evidence:
        engine = self.sup.engine
        if engine is None or not engine.running:
            raise StepFailed("the engine process is gone")
        ranks = ranks_whole(self.sup, "sleep POSTCHECK")  # asleep, every rank still there to wake
        return {"state": self.sup.machine.state.value, "engine_pid": engine.pid, "ranks": ranks}
