"""`POST /v1/wake {tags?, reload?}`: bring a sleeping engine back to READY the runbook's way.

A level-2 sleep discarded the weights, so its wake is weights → `reload_weights` → KV cache and must
be asked for with `reload: true`. Only full wakes are performed: a partial wake leaves the engine
sleeping, and the supervisor has no use for that state. VERIFY is the readiness check again (not
sleeping, memory back, same model, smoke answered); a failed wake leaves the engine FAILED with the
failed step named, then restarts it in place (weights from disk: a known state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.supervisor.engine_admin import WAKE_TAGS, EngineFigures, parse_figures
from corral.supervisor.ops.common import admin_for, fail_and_restart, verify_awake
from corral.supervisor.runbook import Evidence, Refused, Step, StepFailed
from corral.supervisor.states import EngineState

if TYPE_CHECKING:
    from corral.supervisor.lifecycle import EngineSupervisor

S = EngineState


def _before(status: dict[str, Any]) -> EngineFigures | None:
    before = status.get("before")
    if not isinstance(before, dict):
        return None
    return EngineFigures(**before)


class WakePlan:
    kind = "wake"

    def __init__(self, sup: EngineSupervisor, tags: list[str] | None, reload: bool = False) -> None:
        unknown = [t for t in tags or [] if t not in WAKE_TAGS]
        if unknown:
            raise Refused(f"wake tags {unknown} do not exist; the tags are {', '.join(WAKE_TAGS)}")
        if tags and not {"weights", "kv_cache"} <= set(tags):
            raise Refused(
                f"wake tags {tags} would leave the engine sleeping (a partial wake); the supervisor "
                "only wakes fully: omit tags, or give weights, kv_cache and scheduling"
            )
        self.sup = sup
        self.tags = tags
        self.reload = reload
        self.admin = admin_for(sup)
        self.status: dict[str, Any] = {}
        self.sequence: list[str] = []

    async def precheck(self) -> Evidence:
        sup = self.sup
        if sup.machine.state is not S.SLEEPING or sup.sleep_status is None:
            raise Refused(f"wake refused: the engine is {sup.machine.state}, not SLEEPING")
        self.status = dict(sup.sleep_status)
        level = self.status.get("level")
        if level == 2 and not self.reload:
            raise Refused(
                "wake refused: a level-2 sleep discarded the weights; waking them without "
                "reload_weights would serve garbage. Wake with reload (corral wake --reload)"
            )
        if not await self.admin.is_sleeping():
            raise Refused(
                "wake refused: the engine does not report is_sleeping; the supervisor's state is stale"
            )
        self.sequence = (
            ["wake_up?tags=weights", "collective_rpc reload_weights", "wake_up?tags=kv_cache", "wake_up"]
            if level == 2
            else ["wake_up"]
        )
        return {"sleep": self.status, "sequence": self.sequence}

    async def remove_from_routing(self) -> Evidence:
        return {
            "skipped": f"not routable since it left routing for the sleep (state {self.sup.machine.state})"
        }

    async def drain(self) -> Evidence:
        return {"skipped": "nothing is routed to a sleeping engine"}

    async def execute(self) -> Evidence:
        self.sup.transition(S.WAKING, f"waking: {', '.join(self.sequence)}", "waking")
        done: list[Evidence] = []
        if self.status.get("level") == 2:
            done.append({"wake_up weights": await self.admin.wake_up(["weights"])})
            done.append({"reload_weights": await self.admin.reload_weights()})
            done.append({"wake_up kv_cache": await self.admin.wake_up(["kv_cache"])})
        done.append({"wake_up": await self.admin.wake_up(self.tags)})
        return {"calls": done}

    async def verify(self) -> Evidence:
        checked = await verify_awake(self.sup, self.admin, _before(self.status))
        self.sup.sleep_status = None
        self.sup.transition(
            S.READY, "awake: memory back, model listed, smoke answered", None, **checked["smoke"]
        )
        self.sup.resume_serving()
        return checked

    async def recover(self, failed_step: Step, cause: str) -> Evidence:
        return await fail_and_restart(self.sup, f"wake failed at {failed_step}: {cause}")

    async def postcheck(self) -> Evidence:
        figures = await self.admin.figures()
        if figures.sleep_state not in (None, "awake"):
            raise StepFailed(f"sleep state {figures.sleep_state} after the wake")
        return {"state": self.sup.machine.state.value, "figures": figures.to_json()}


__all__ = ["WakePlan", "parse_figures"]
