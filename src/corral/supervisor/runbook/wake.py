"""`POST /v1/wake {tags?, reload?}`: bring a sleeping engine back to READY the runbook's way, in one
wake or in steps.

A level-2 sleep discarded the weights, so waking them is weights → `reload_weights` and must be asked
for with `reload: true`. With `tags`, a wake may be partial (`weights` now, `kv_cache` later): VERIFY
then checks that the woken memory is back and the engine still sleeps, and the supervisor stays
SLEEPING (out of routing) with the woken tags in its sleep status. The wake that wakes the last tags
(or any wake without tags) completes it: VERIFY is the readiness check again (not sleeping, memory
back, same model, smoke answered), and where the sleep emptied the prefix cache (level 1 or 2, or a
KV release) the prefix epoch moves. A wake with reload reads `reload_weights` per rank and, when it
completes, fingerprints the bundle again, as a weight reload does (`reload_checks.py`). A failed wake
leaves the engine FAILED with the failed step named, then restarts it in place (weights from disk: a
known state). A completed wake's POSTCHECK waits for the routers subscribed at the return to READY to
acknowledge the engine back in their routing (`readded.py`) and records which did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.engine.dev_api import EngineFigures, parse_figures
from corral.supervisor.lifecycle.device_memory import DeviceReading
from corral.supervisor.lifecycle.leftover_scene import EngineSnapshot
from corral.supervisor.lifecycle.memory_checks import wake_verdict
from corral.supervisor.lifecycle.sleep_status import SleepStatus
from corral.supervisor.lifecycle.states import EngineState
from corral.supervisor.runbook.cleanup import postcheck_leftovers, rss_proxy
from corral.supervisor.runbook.common import (
    admin_for,
    device_reading,
    device_verdict,
    fail_and_restart,
    figures_passed,
    logged_figures,
    verify_awake,
)
from corral.supervisor.runbook.prefix_reset import prefix_cache_wiped, prefix_state_after
from corral.supervisor.runbook.rank_guard import refuse_unless_whole
from corral.supervisor.runbook.readded import Readding, confirm_readded
from corral.supervisor.runbook.reload_checks import files_digest, identity_after, reload_every_rank
from corral.supervisor.runbook.template import Evidence, Refused, Step, StepFailed
from corral.supervisor.runbook.wake_steps import (
    WakeSteps,
    asleep_tags,
    check_tag_names,
    plan_wake,
    run_calls,
    verify_partial,
)

if TYPE_CHECKING:
    from corral.supervisor.checks.bundle import Bundle
    from corral.supervisor.runbook.engine_access import EngineAccess

S = EngineState
PARTIALLY_AWAKE = "partially_awake"


def _before(status: dict[str, Any]) -> EngineFigures | None:
    before = status.get("before")
    if not isinstance(before, dict):
        return None
    return EngineFigures(**before)


class WakePlan:
    kind = "wake"

    def __init__(self, sup: EngineAccess, tags: list[str] | None, reload: bool = False) -> None:
        check_tag_names(tags)
        self.sup = sup
        self.tags = tags
        self.reload = reload
        self.admin = admin_for(sup)
        self.sleeping: SleepStatus | None = None  # as PRECHECK found it
        self.status: dict[str, Any] = {}  # the same, as the evidence shows it
        self.steps: WakeSteps | None = None
        self.asleep: EngineSnapshot | None = None  # the engine's processes and RSS while asleep
        self.bundle_before: Bundle | None = None  # with reload: the fingerprint it changes from
        self.files_at_call: dict[str, Any] | None = None  # with reload: the files reload_weights read
        self.reloaded = False
        self.readding: Readding | None = None  # the READY epoch and the routers then subscribed

    @property
    def _steps(self) -> WakeSteps:
        assert self.steps is not None, "precheck first"
        return self.steps

    async def precheck(self) -> Evidence:
        sup = self.sup
        if sup.machine.state is not S.SLEEPING or sup.sleep_status is None:
            raise Refused(f"wake refused: the engine is {sup.machine.state}, not SLEEPING")
        refuse_unless_whole(sup, "wake")  # a rank lost in its sleep: the sleeping rank watch acts
        self.sleeping = sup.sleep_status
        self.status = sup.sleep_status.to_json()
        self.steps = plan_wake(self.status.get("level"), asleep_tags(self.status), self.tags, self.reload)
        if not await self.admin.is_sleeping():
            raise Refused(
                "wake refused: the engine does not report is_sleeping; the supervisor's state is stale"
            )
        self.asleep = await EngineSnapshot.take(sup.engine)
        return {
            "sleep": self.status,
            "sequence": self._steps.sequence,
            "waking": self._steps.waking,
            "completes": self._steps.completes,
        }

    async def remove_from_routing(self) -> Evidence:
        return {
            "skipped": f"not routable since it left routing for the sleep (state {self.sup.machine.state})"
        }

    async def drain(self) -> Evidence:
        return {"skipped": "nothing is routed to a sleeping engine"}

    async def execute(self) -> Evidence:
        steps = self._steps
        if steps.completes:
            self.sup.transition(S.WAKING, f"waking: {', '.join(steps.sequence)}", "waking")
        else:
            self.sup.transition(
                S.SLEEPING,
                f"partial wake: {', '.join(steps.sequence)}; {steps.still_asleep} stays asleep",
                "partial_waking",
            )
        self.bundle_before = self.sup.bundle
        return {"calls": await run_calls(self.admin, steps, self._reload)}

    async def _reload(self) -> Evidence:
        self.files_at_call = await files_digest(self.sup)
        self.reloaded = True
        return await reload_every_rank(self.sup, self.admin)

    async def verify(self) -> Evidence:
        steps = self._steps
        device_before = DeviceReading.from_json(self.status.get("device_before"))
        if not steps.completes:
            checked = await verify_partial(
                self.admin, _before(self.status), self._woken(), steps.still_asleep
            )
            checked["memory"] = await self._partial_memory(checked, device_before)
            return self._partially_awake(checked)
        checked = await verify_awake(self.sup, self.admin, _before(self.status), device_before)
        if self.reloaded:
            checked["identity"] = await identity_after(self.sup, self.bundle_before, self.files_at_call)
        if prefix_cache_wiped(self.status):  # a plain level-0 pause keeps the prefix cache
            checked["prefix_cache"] = await prefix_state_after(
                self.sup, self.admin, _before(self.status), "wake"
            )
        self.sup.note_sleep(None)
        ready = self.sup.transition(
            S.READY, "awake: memory back, model listed, smoke answered", None, **checked["smoke"]
        )
        self.readding = Readding.now(self.sup.routers, ready.epoch)
        self.sup.resume_serving()
        return checked

    async def _partial_memory(self, checked: Evidence, device_before: DeviceReading | None) -> Evidence:
        """The engine's figures as checked, or else NVML's: the woken share back, the rest freed."""
        if checked["memory"] is not None:
            return figures_passed(self.sup, self.kind, checked["memory"])
        still, logged, thresholds = self._steps.still_asleep, logged_figures(self.sup), self.sup.config.memory
        return device_verdict(
            self.sup,
            self.kind,
            device_before,
            await device_reading(self.sup, EngineFigures(**checked["figures"])),
            lambda b, a: wake_verdict(b, a, still, logged, thresholds),
        )

    def _woken(self) -> list[str]:
        before = self.status.get("woken_tags")
        earlier = [str(t) for t in before] if isinstance(before, list) else []
        return [t for t in ("weights", "kv_cache") if t in earlier or t in self._steps.waking]

    def _partially_awake(self, checked: Evidence) -> Evidence:
        woken, asleep = checked["woken_tags"], checked["asleep_tags"]
        assert self.sleeping is not None, "precheck first"
        self.sup.note_sleep(self.sleeping.partially_awake(woken, asleep))
        self.sup.transition(
            S.SLEEPING,
            f"partially awake: {woken} woken, {asleep} asleep; out of routing until a wake completes",
            PARTIALLY_AWAKE,
            woken_tags=woken,
            asleep_tags=asleep,
            figures=checked["figures"],
        )
        return checked

    async def recover(self, failed_step: Step, cause: str) -> Evidence:
        return await fail_and_restart(self.sup, f"wake failed at {failed_step}: {cause}")

    async def postcheck(self) -> Evidence:
        figures = await self.admin.figures()
        if not self._steps.completes:
            if not await self.admin.is_sleeping():
                raise StepFailed("the engine reports is_sleeping false after a partial wake")
            return {"state": self.sup.machine.state.value, "figures": figures.to_json()}
        if figures.sleep_state not in (None, "awake"):
            raise StepFailed(f"sleep state {figures.sleep_state} after the wake")
        # awake: no CPU weight backup may remain (at level 1 one was expected while asleep)
        leftovers = await postcheck_leftovers(
            self.sup,
            self.kind,
            awake=True,
            cpu_backup_bytes=figures.cpu_backup_bytes,
            rss=await rss_proxy(self.sup, self.asleep, self.status),
        )
        routing: Evidence | None = None
        if self.readding is not None:
            within = self.sup.config.drain.propagation_timeout
            routing = await confirm_readded(self.sup.routers, self.readding, within, self.sup.log)
        return {
            "state": self.sup.machine.state.value,
            "figures": figures.to_json(),
            "leftovers": leftovers,
            "routing": routing,
        }


__all__ = ["WakePlan", "parse_figures"]
