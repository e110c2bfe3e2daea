"""`POST /v1/lora/load {name, path}` and `/v1/lora/unload {name}`: LoRA adapters as runbook operations.

Loading adds to routing and takes nothing out of it: EXECUTE loads, VERIFY finds the adapter in
`/v1/models` and gets a smoke answer from it, and it joins the desired set (reloaded after every
restart). Unloading drains that adapter only: REMOVE FROM ROUTING publishes a READY event that
withdraws the adapter (routers stop routing `model: NAME` here and acknowledge the epoch), DRAIN
waits until `vllm:lora_requests_info` shows no request of it running or waiting, then EXECUTE unloads.
Both read the engine's GPU memory and KV capacity just before EXECUTE and again in VERIFY, which
judges them (`lora_memory.py`): a load that took KV blocks, an unload that did not free memory, fail.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from corral.engine.metric_names import LORA_INFO
from corral.supervisor.checks.adapters import EngineAdapters
from corral.supervisor.checks.readiness import NotReady
from corral.supervisor.lifecycle.states import EngineState
from corral.supervisor.runbook.lora_memory import (
    Footprint,
    judge,
    kv_verdict,
    load_memory_verdict,
    read_footprint,
    unload_memory_verdict,
)
from corral.supervisor.runbook.template import Evidence, Refused, Step, StepFailed

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess

S = EngineState
NAME_MAX = 200


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > NAME_MAX:
        raise Refused(
            f"adapter name must be a non-empty string of at most {NAME_MAX} characters, not {name!r}"
        )
    return name


def _require_ready(sup: EngineAccess, kind: str) -> None:
    if sup.machine.state is not S.READY:
        raise Refused(f"{kind} refused: the engine is {sup.machine.state}, not READY")


class LoadAdapterPlan:
    kind = "lora_load"

    def __init__(self, sup: EngineAccess, name: object, path: object) -> None:
        self.sup = sup
        self.name = _check_name(name)
        if not isinstance(path, str) or not path:
            raise Refused(f"adapter path must be a non-empty string, not {path!r}")
        self.path = path
        self.engine = EngineAdapters(sup.session, sup.config.engine_url)
        self.before: Footprint | None = None

    async def precheck(self) -> Evidence:
        _require_ready(self.sup, "lora load")
        served = await self.engine.served()
        if self.name in served:
            raise Refused(f"lora load refused: adapter {self.name!r} is already loaded")
        return {"served": served}

    async def remove_from_routing(self) -> Evidence:
        return {"skipped": "loading an adapter takes nothing out of routing"}

    async def drain(self) -> Evidence:
        return {"skipped": "no request uses an adapter that is not loaded yet"}

    async def execute(self) -> Evidence:
        self.before = await read_footprint(self.sup)
        return {"load_lora_adapter": await self.engine.load(self.name, self.path)}

    async def verify(self) -> Evidence:
        served = await self.engine.served()
        if self.name not in served:
            raise StepFailed(
                f"adapter {self.name!r} is not listed in /v1/models after loading", served=served
            )
        try:
            smoke = await self.sup.readiness.smoke(self.sup.session, self.name)
        except NotReady as exc:
            raise StepFailed(f"smoke request to adapter {self.name!r}: {exc}") from exc
        assert self.before is not None
        after = await read_footprint(self.sup)
        memory = load_memory_verdict(self.before, after)
        checked = judge(self.sup, "lora_load", memory, kv_verdict("the load", self.before, after))
        growth = memory.evidence.get("growth_bytes")
        if isinstance(growth, int):
            self.sup.adapters.load_growth[self.name] = growth
        try:
            self.sup.adapters.add_runtime(self.name, self.path)
        except OSError as exc:
            raise StepFailed(
                f"adapter {self.name!r} loaded but not recorded in the state dir, so a restart would "
                f"lose it: {exc}; fix the state dir ({self.sup.config.state_dir}) and load it again"
            ) from exc
        self.sup.adapters.note_served(served)
        self.sup.transition(
            S.READY,
            f"adapter {self.name!r} loaded",
            "adapters_changed",
            adapters=served,
            withdrawn_adapters=[],
        )
        return {"served": served, "smoke": smoke.to_json(), **checked}

    async def recover(self, failed_step: Step, cause: str) -> Evidence:
        served = await self.engine.served()
        if self.name in served:
            await self.engine.unload(self.name)
            return {"outcome": f"adapter {self.name!r} unloaded again", "served": await self.engine.served()}
        return {"outcome": "nothing was loaded", "served": served}

    async def postcheck(self) -> Evidence:
        return {"desired": sorted(self.sup.adapters.desired)}


class UnloadAdapterPlan:
    kind = "lora_unload"

    def __init__(self, sup: EngineAccess, name: object, drain_timeout: float | None = None) -> None:
        self.sup = sup
        self.name = _check_name(name)
        self.engine = EngineAdapters(sup.session, sup.config.engine_url)
        self.drain_timeout = drain_timeout if drain_timeout is not None else sup.config.drain.drain_timeout
        self.withdrawn_epoch: int | None = None
        self.before: Footprint | None = None

    async def precheck(self) -> Evidence:
        _require_ready(self.sup, "lora unload")
        served = await self.engine.served()
        if self.name not in served:
            raise Refused(f"lora unload refused: adapter {self.name!r} is not loaded (loaded: {served})")
        return {"served": served}

    def _publish(self, withdrawn: list[str], reason: str) -> int:
        served = [a for a in self.sup.adapters.served if a not in withdrawn]
        event = self.sup.transition(
            S.READY, reason, "adapters_changed", adapters=served, withdrawn_adapters=withdrawn
        )
        return event.epoch

    async def remove_from_routing(self) -> Evidence:
        routers = self.sup.routers
        epoch = self._publish([self.name], f"adapter {self.name!r} withdrawn from routing before its unload")
        self.withdrawn_epoch = epoch
        s = self.sup.config.drain
        wait = routers.begin_wait(epoch)
        started = time.monotonic()
        try:
            while routers.missing(epoch) and time.monotonic() - started < s.propagation_timeout:
                routers.arm()
                await routers.changed(min(s.poll_seconds, 0.5))
        finally:
            done = routers.end_wait()
        assert done is not None
        if done.missing:
            raise StepFailed(
                f"routers {done.missing} did not acknowledge the withdrawal of {self.name!r} "
                f"within {s.propagation_timeout:g}s",
                epoch=epoch,
            )
        return {
            "epoch": epoch,
            "routers_acknowledged": sorted(wait.acknowledged),
            "routers_gone": wait.gone,
            "seconds": round(time.monotonic() - started, 3),
        }

    async def drain(self) -> Evidence:
        started = time.monotonic()
        gate = self.sup.gate
        if gate is not None:  # exact: the gate counts this adapter's requests itself
            if not await gate.wait_idle(self.name, self.drain_timeout):
                raise StepFailed(
                    f"requests of adapter {self.name!r} still in flight after {self.drain_timeout:g}s"
                )
            return {
                "adapter_in_flight": 0,
                "source": "admission gate",
                "seconds": round(time.monotonic() - started, 3),
            }
        while True:
            busy = await self.engine.in_flight()
            if busy is None:
                raise StepFailed(f"the engine does not report {LORA_INFO}; adapter in-flight unknown")
            if self.name not in busy:
                return {
                    "adapter_in_flight": 0,
                    "source": LORA_INFO,
                    "seconds": round(time.monotonic() - started, 3),
                }
            if time.monotonic() - started > self.drain_timeout:
                raise StepFailed(
                    f"requests of adapter {self.name!r} still in flight after {self.drain_timeout:g}s"
                )
            await asyncio.sleep(0.05)

    async def execute(self) -> Evidence:
        self.before = await read_footprint(self.sup)
        return {"unload_lora_adapter": await self.engine.unload(self.name)}

    async def verify(self) -> Evidence:
        served = await self.engine.served()
        if self.name in served:
            raise StepFailed(f"adapter {self.name!r} still listed after unloading", served=served)
        self.sup.adapters.note_served(served)
        self._forget()
        assert self.before is not None
        after = await read_footprint(self.sup)
        growth = self.sup.adapters.load_growth.pop(self.name, None)
        memory = unload_memory_verdict(self.before, after, growth)
        checked = judge(self.sup, "lora_unload", memory, kv_verdict("the unload", self.before, after))
        return {"served": served, **checked}

    def _forget(self) -> None:
        try:
            self.sup.adapters.remove(self.name)
        except OSError as exc:
            raise StepFailed(
                f"adapter {self.name!r} unloaded but still recorded in the state dir, so a restart "
                f"would load it again: {exc}; fix the state dir ({self.sup.config.state_dir}) and "
                "unload it again after the restart"
            ) from exc

    async def recover(self, failed_step: Step, cause: str) -> Evidence:
        served = await self.engine.served()
        if self.name in served:  # still loaded: offer it to routing again
            self.sup.adapters.note_served(served)
            self._publish([], f"adapter {self.name!r} back in routing: its unload failed at {failed_step}")
            return {"outcome": f"adapter {self.name!r} still loaded and routed again", "served": served}
        self.sup.adapters.note_served(served)
        try:
            self.sup.adapters.remove(self.name)
        except OSError as exc:
            return {
                "outcome": f"adapter {self.name!r} is gone from the engine but still in the state dir",
                "error": str(exc),
                "served": served,
            }
        return {"outcome": f"adapter {self.name!r} is gone from the engine", "served": served}

    async def postcheck(self) -> Evidence:
        return {"desired": sorted(self.sup.adapters.desired), "state": self.sup.machine.state.value}
