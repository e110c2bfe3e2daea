"""`POST /v1/bundle {"name": B}`: move this engine to another bundle declared on this host
(`corral supervise --bundle FILE`, repeatable), the in-place step of a rollout across hosts whose
processes Corral does not start itself.

Only declared bundles: the management API never takes a command line, so a token that leaks cannot
make the host run a program of the caller's choosing.

PRECHECK (READY, the bundle declared and not the one running) → REMOVE FROM ROUTING (confirmed by
every subscribed router) → DRAIN (in-flight requests finish) → EXECUTE (the engine stopped, then
started with the bundle's command and environment) → VERIFY (READY again through the full startup:
health, model, smoke; the new fingerprint recorded) → POSTCHECK. With a preload daemon, EXECUTE moves
it first: a bundle whose daemon command or vLLM version differs gets its own daemon (engine stopped, old
daemon stopped, new one started and healthy) before the engine starts from it; an unchanged daemon is
kept (`corral.supervisor.lifecycle.preload_swap`). RECOVER: before EXECUTE, the engine
still runs the old bundle and is checked and put back in routing; after it, the old command is started
again (after the old daemon, when it was replaced) and must reach READY, or the engine is FAILED with
both failures named.

From a start that failed for good (FAILED/`gave_up` or `stay_unready`: nothing restarts by itself) an
operator may switch to any declared bundle, the failed one included (a restart once the cause is fixed);
`--on-startup-failure rollback=B` runs the same plan as a `rollback` operation (`roll_back`). Then there
is no routing to leave and nothing in flight, VERIFY waits for the start's own verdict (its deadlines
bound it), and RECOVER has nothing to go back to: the engine stays FAILED with both failures named.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from corral.bundle_spec import BundleSpec
from corral.redaction import redact_argv
from corral.supervisor.checks.readiness import NotReady
from corral.supervisor.lifecycle.drain import Leaving
from corral.supervisor.lifecycle.failure_strategy import LIFECYCLE_ENDED, StartupFailure, Verdict
from corral.supervisor.lifecycle.leftover_scene import EngineSnapshot
from corral.supervisor.lifecycle.states import EngineState, StateEvent
from corral.supervisor.runbook.cleanup import postcheck_leftovers
from corral.supervisor.runbook.common import apply_policy, leave_routing
from corral.supervisor.runbook.run import start_operation
from corral.supervisor.runbook.template import Evidence, Refused, Step, StepFailed

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess

S = EngineState


class SwitchBundlePlan:
    kind = "switch_bundle"

    def __init__(
        self,
        sup: EngineAccess,
        name: str,
        ready_timeout: float | None = None,
        rollback_of: StartupFailure | None = None,
    ) -> None:
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
        self.rollback_of = rollback_of
        if rollback_of is not None:
            self.kind = "rollback"
        self._failed_start: str | None = None  # the reason of the failed start this plan moves on from
        self._drainer: Leaving | None = None
        self._executed = False
        self._replaced: EngineSnapshot | None = None  # the engine the switch stops: gone by POSTCHECK

    async def precheck(self) -> Evidence:
        sup = self.sup
        machine = sup.machine
        if self.rollback_of is not None:
            if machine.state is not S.FAILED or machine.sub_state != Verdict.ROLLING_BACK:
                raise Refused(f"rollback refused: the engine is {machine.state}/{machine.sub_state}")
            self._failed_start = self.rollback_of.reason
        elif machine.state is S.FAILED and machine.sub_state in LIFECYCLE_ENDED:
            self._failed_start = str(machine.snapshot().get("reason"))
        elif machine.state is not S.READY:
            raise Refused(
                f"bundle switch refused: the engine is {machine.state}, not READY "
                "(nor FAILED with nothing restarting it)"
            )
        elif self.previous.name == self.target.name:
            raise Refused(f"bundle switch refused: the engine already runs bundle {self.target.name!r}")
        evidence: Evidence = {
            "from": self.previous.name,
            "to": self.target.name,
            "fingerprint_before": sup.bundle.fingerprint if sup.bundle else None,
        }
        if self._failed_start is not None:
            evidence["failed_start"] = self._failed_start
        self._replaced = await EngineSnapshot.take(sup.engine)
        return evidence

    async def remove_from_routing(self) -> Evidence:
        if self._failed_start is not None:
            return {"skipped": f"the engine is {self.sup.machine.state}: no router routes to it"}
        reason = f"bundle switch to {self.target.name}: readiness withdrawn"
        self._drainer, evidence = await leave_routing(self.sup, reason, "wait")
        return evidence

    async def drain(self) -> Evidence:
        if self._failed_start is not None:
            return {"skipped": "no engine serves: nothing in flight"}
        assert self._drainer is not None
        return await apply_policy(self.sup, self._drainer, "wait")

    async def execute(self) -> Evidence:
        self._executed = True
        argv = self.sup.use_bundle(self.target)
        what = f"{'rollback' if self.rollback_of is not None else 'bundle switch'} to {self.target.name}"
        evidence: Evidence = {"argv": redact_argv(argv), "env": sorted(self.target.env)}
        # the bundle's daemon before its engine: replaced (engine, then daemon stopped; the new one
        # healthy) when its command or vLLM differs, else kept
        move = await self.sup.move_preload(what)
        if move is not None:
            evidence["preload"] = move.to_json()
            if move.problem is not None:
                raise StepFailed(
                    f"the preload daemon of bundle {self.target.name} is not healthy: {move.problem}",
                    **evidence,
                )
        await self.sup.restart_in_place(what)
        return evidence

    async def verify(self) -> Evidence:
        # after a failed start the new start's own deadlines bound the wait (its verdict is awaited)
        await self._ready_again(None if self._failed_start is not None else self.ready_timeout)
        bundle, smoke = self.sup.bundle, self.sup.last_smoke
        return {
            "fingerprint": bundle.fingerprint if bundle else None,
            "bundle": self.target.name,
            # the new engine's first request (its startup smoke); steady state is OBSERVE's
            "warmup_ttft_ms": smoke.warmup_ttft_ms if smoke is not None else None,
        }

    async def _ready_again(self, within: float | None) -> None:
        """Until the restarted engine is READY (its full startup passed), or fails, or time is up;
        woken by each state event rather than polling."""
        deadline = time.monotonic() + within if within is not None else None
        machine = self.sup.machine
        changed = asyncio.Event()

        def note(_: StateEvent) -> None:
            changed.set()

        machine.subscribe(note)
        try:
            while machine.state is not S.READY:
                reason = machine.snapshot().get("reason")
                if machine.state is S.FAILED and machine.sub_state in LIFECYCLE_ENDED:
                    raise StepFailed(f"the engine failed for good: {reason}")
                left = deadline - time.monotonic() if deadline is not None else None
                if left is not None and left <= 0:
                    raise StepFailed(f"not READY within {within:g}s: {machine.state} {reason}")
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), left)
        finally:
            machine.unsubscribe(note)

    async def recover(self, failed_step: Step, cause: str) -> Evidence:
        sup = self.sup
        if self._failed_start is not None:  # no ping-pong: what ran before had failed to start
            both = (
                f"{self.kind} to {self.target.name} failed: {cause}; "
                f"before it, the start of {self.previous.name} had failed: {self._failed_start}"
            )
            if sup.machine.state is S.FAILED:
                sup.transition(S.FAILED, both[:2000], sup.machine.sub_state, recoverable=False)
            return {"outcome": f"FAILED: nothing to go back to ({self.previous.name} had failed to start)"}
        if not self._executed:
            try:
                model = await sup.readiness.served_model(sup.session)
                smoke = await sup.readiness.smoke(sup.session, model)
            except NotReady as exc:
                raise StepFailed(f"the old engine no longer serves: {exc}") from exc
            sup.transition(S.READY, f"bundle switch abandoned: {cause}", None, **smoke.to_json())
            sup.resume_serving()
            return {"outcome": f"still on {self.previous.name}, READY again"}
        if failed_step is Step.OBSERVE and sup.machine.state is S.READY:  # serving: leave routing first
            reason = f"bundle {self.target.name} failed its observed window: back to {self.previous.name}"
            with contextlib.suppress(StepFailed):
                leaving, _ = await leave_routing(sup, reason, "wait")
                await apply_policy(sup, leaving, "wait")
        sup.use_bundle(self.previous)
        reason = f"bundle switch to {self.target.name} failed: {cause}"
        move = await sup.move_preload(reason)  # the old pair: its daemon back before its engine
        moved: Evidence = {"preload": move.to_json()} if move is not None else {}
        await sup.restart_in_place(reason)
        try:
            await self._ready_again(self.ready_timeout)
        except StepFailed as exc:
            return {"outcome": f"back on {self.previous.name} failed too: {exc}", **moved}
        return {"outcome": f"back on {self.previous.name}, READY again", **moved}

    async def postcheck(self) -> Evidence:
        if self.sup.machine.state is not S.READY:
            raise StepFailed(f"state {self.sup.machine.state} after the bundle switch")
        # the old engine, its ranks and its sockets are gone
        leftovers = await postcheck_leftovers(self.sup, self.kind, before=self._replaced)
        return {"state": "READY", "bundle": self.sup.running_bundle.name, "leftovers": leftovers}


async def roll_back(sup: EngineAccess, failure: StartupFailure) -> str | None:
    """`--on-startup-failure rollback=B`: the switch to B as a `rollback` operation, started by the
    supervisor itself after a failed start; why it could not start, or None once it runs."""
    assert failure.choice.bundle is not None
    try:
        plan = SwitchBundlePlan(sup, failure.choice.bundle, rollback_of=failure)
        await start_operation(sup, plan, None)
    except Refused as exc:
        return str(exc)
    return None
