"""`POST /v1/bundle {"name": B}`: move this engine to another bundle declared on this host
(`corral supervise --bundle FILE`, repeatable), the in-place step of a rollout across hosts whose
processes Corral does not start itself.

Only declared bundles: the management API never takes a command line, so a token that leaks cannot
make the host run a program of the caller's choosing.

PRECHECK (READY, the bundle declared and not the one running) → REMOVE FROM ROUTING (confirmed by
every subscribed router) → DRAIN (in-flight requests finish) → EXECUTE (the engine stopped, then
started with the bundle's command and environment) → VERIFY (READY again through the full startup:
health, model, smoke; the new fingerprint recorded) → POSTCHECK. RECOVER: before EXECUTE, the engine
still runs the old bundle and is checked and put back in routing; after it, the old command is started
again and must reach READY, or the engine is FAILED with both failures named.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from corral.bundle_spec import BundleSpec
from corral.supervisor.checks.engine_auth import redact_argv
from corral.supervisor.checks.readiness import NotReady
from corral.supervisor.lifecycle.drain import Leaving
from corral.supervisor.lifecycle.states import EngineState, StateEvent
from corral.supervisor.runbook.common import apply_policy, leave_routing
from corral.supervisor.runbook.template import Evidence, Refused, Step, StepFailed

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess

S = EngineState


class SwitchBundlePlan:
    kind = "switch_bundle"

    def __init__(self, sup: EngineAccess, name: str, ready_timeout: float | None = None) -> None:
        # the command as configured is a bundle too (by its --bundle-name): what a rollback goes back to
        initial = BundleSpec(name=sup.config.bundle_name)
        declared = {b.name: b for b in (initial, *sup.config.bundles)}
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise Refused(
                f"bundle {name!r} is not declared on this host (declared: {known}); "
                "add it with `corral supervise --bundle FILE` there"
            )
        self.sup = sup
        self.target: BundleSpec = declared[name]
        self.previous = sup.running_bundle
        self.ready_timeout = ready_timeout or sup.config.startup_timeout
        self._drainer: Leaving | None = None
        self._executed = False

    async def precheck(self) -> Evidence:
        sup = self.sup
        if sup.machine.state is not S.READY:
            raise Refused(f"bundle switch refused: the engine is {sup.machine.state}, not READY")
        if self.previous.name == self.target.name:
            raise Refused(f"bundle switch refused: the engine already runs bundle {self.target.name!r}")
        return {
            "from": self.previous.name,
            "to": self.target.name,
            "fingerprint_before": sup.bundle.fingerprint if sup.bundle else None,
        }

    async def remove_from_routing(self) -> Evidence:
        reason = f"bundle switch to {self.target.name}: readiness withdrawn"
        self._drainer, evidence = await leave_routing(self.sup, reason, "wait")
        return evidence

    async def drain(self) -> Evidence:
        assert self._drainer is not None
        return await apply_policy(self.sup, self._drainer, "wait")

    async def execute(self) -> Evidence:
        self._executed = True
        argv = self.sup.use_bundle(self.target)
        await self.sup.restart_in_place(f"bundle switch to {self.target.name}")
        return {"argv": redact_argv(argv), "env": sorted(self.target.env)}

    async def verify(self) -> Evidence:
        await self._ready_again(self.ready_timeout)
        bundle = self.sup.bundle
        return {"fingerprint": bundle.fingerprint if bundle else None, "bundle": self.target.name}

    async def _ready_again(self, within: float) -> None:
        """Until the restarted engine is READY (its full startup passed), or fails, or time is up;
        woken by each state event rather than polling."""
        deadline = time.monotonic() + within
        machine = self.sup.machine
        changed = asyncio.Event()

        def note(_: StateEvent) -> None:
            changed.set()

        machine.subscribe(note)
        try:
            while machine.state is not S.READY:
                reason = machine.snapshot().get("reason")
                if machine.state is S.FAILED and machine.sub_state == "gave_up":
                    raise StepFailed(f"the engine failed for good: {reason}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StepFailed(f"not READY within {within:g}s: {machine.state} {reason}")
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), left)
        finally:
            machine.unsubscribe(note)

    async def recover(self, failed_step: Step, cause: str) -> Evidence:
        sup = self.sup
        if not self._executed:
            try:
                model = await sup.readiness.served_model(sup.session)
                smoke = await sup.readiness.smoke(sup.session, model)
            except NotReady as exc:
                raise StepFailed(f"the old engine no longer serves: {exc}") from exc
            sup.transition(S.READY, f"bundle switch abandoned: {cause}", None, **smoke.to_json())
            sup.resume_serving()
            return {"outcome": f"still on {self.previous.name}, READY again"}
        sup.use_bundle(self.previous)
        await sup.restart_in_place(f"bundle switch to {self.target.name} failed: {cause}")
        try:
            await self._ready_again(self.ready_timeout)
        except StepFailed as exc:
            return {"outcome": f"back on {self.previous.name} failed too: {exc}"}
        return {"outcome": f"back on {self.previous.name}, READY again"}

    async def postcheck(self) -> Evidence:
        if self.sup.machine.state is not S.READY:
            raise StepFailed(f"state {self.sup.machine.state} after the bundle switch")
        return {"state": "READY", "bundle": self.sup.running_bundle.name}
