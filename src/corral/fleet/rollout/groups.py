"""`corral rollout` and `corral rollback`: move a fleet that Corral runs to another bundle, one batch of
serving groups at a time, without dropping a request.

For each serving group still on another bundle, with surge (`max_surge` > 0, the default):

    START     a new group from the target bundle; its supervisors run the full startup, smoke and
              readiness (all or nothing: a member that fails takes the whole new group down)
    VERIFY    every new member READY, one fingerprint in the group, a streamed and a non-streamed
              smoke request straight to each new engine (usage and finish reason)
    ROUTED    the router lists every new engine as routable (checked on its /v1/fleet, not assumed)
    CANARY    (with --canary-seconds) the new group serves real traffic, its slow-start share, while
              its errors and TTFT over the window are compared with the old groups' over the same
              seconds (fleet/rollout/canary.py); worse than the thresholds, or too little traffic to
              judge, and RECOVER takes the new group out (confirmed drain, retire, gone): the old
              group, never drained, keeps serving, and the rollout stops
    DRAIN     the old group's confirmed drain: every router acknowledged the removal, in-flight
              requests finished, the engine stopped (the supervisor's drain report is kept)
    RETIRE    the old group's processes stopped and gone from the router's backends
    GONE      the router no longer lists the old engines

Without surge (`max_unavailable` > 0), DRAIN and RETIRE come first; a new group that then fails is
replaced by RECOVER: the group's previous bundle started again the same way.

A prefill/decode fleet (groups with roles) moves in waves instead (fleet/rollout/paired.py).

PRECHECK comes first (router answering, every group READY with one fingerprint), POSTCHECK last (the
whole `corral verify` checklist). Any failure stops the rollout where it is: groups not yet touched keep
serving on their bundle, the new group that failed is stopped, and the change record says which step
failed and why. The change record lists every step with its start time and duration.
"""

from __future__ import annotations

import asyncio

import aiohttp

from corral.bundle_spec import BundleSpec
from corral.clients.calls import APIError
from corral.clients.up import UpControlClient
from corral.fleet.checks.verify import FAIL, smoke
from corral.fleet.rollout.base import RolloutBase
from corral.fleet.rollout.steps import Group, RolloutJob, Step, StepFailed, StepObserver


class LocalRollout(RolloutBase):
    """A fleet whose processes `corral up` runs: new serving groups are started beside the old ones
    (surge) or in their place, through the fleet's control API."""

    def __init__(
        self,
        control: UpControlClient,
        session: aiohttp.ClientSession,
        job: RolloutJob,
        observer: StepObserver | None = None,
    ) -> None:
        super().__init__(session, job, observer)
        self.control = control
        self._old_engines: set[str] = set()

    async def _groups(self) -> list[Group]:
        return [Group.of(g) for g in (await self.control.groups()).groups]

    async def _precheck(self, step: Step) -> list[Group]:
        todo = await super()._precheck(step)
        # a canary's baseline: the engines still serving on a bundle other than the target
        self._old_engines = {e for g in todo for e in g.engines}
        return todo

    async def _move(self, old: Group) -> None:
        size = len(old.members)
        if self.settings.max_surge:
            new = await self._bring_up(old, self.target, size)
            await self._watch_canary(new)
            await self._take_down(old)
        else:
            await self._take_down(old)
            try:
                new = await self._bring_up(old, self.target, size)
                await self._watch_canary(new)
            except StepFailed:
                if old.bundle is not None:
                    await self._step("RECOVER", old.name, lambda s: self._recover(s, old, size))
                raise
        self.replaced.append({"old": old.name, "new": new.name, "fingerprint": self.fingerprints[new.name]})

    async def _watch_canary(self, new: Group) -> None:
        """CANARY for a routed new group (nothing without --canary-seconds); a failed one takes the
        group out again, its in-flight requests finishing, and goes on up."""
        if not self.settings.canary.seconds:
            return
        old = sorted(self._old_engines)
        try:
            await self._step("CANARY", new.name, lambda s: self._canary(s, new.engines, old))
        except StepFailed:
            await self._step("RECOVER", new.name, lambda s: self._withdraw(s, new))
            raise

    async def _withdraw(self, step: Step, group: Group) -> None:
        """A routed group out of the fleet the way an old one leaves: confirmed drain, retire, gone."""
        await self._drain(step, group)
        drained = step.detail
        await self._retire(step, group)
        retired = step.detail
        await self._wait_routed(step, group.engines, False)
        step.detail = f"{group.name} taken out: {drained}; {retired}; {step.detail}"

    async def _recover(self, step: Step, old: Group, size: int) -> None:
        assert old.bundle is not None
        group = await self._bring_up(old, old.bundle, size, recovering=True)
        step.detail = f"{group.name} started again on {old.bundle.name} in place of {old.name}"

    async def _bring_up(self, old: Group, bundle: BundleSpec, size: int, recovering: bool = False) -> Group:
        label = f"{old.name}'" if not recovering else f"{old.name} (recover)"

        async def start(step: Step) -> Group:
            within = self.settings.recover_timeout if recovering else self.settings.start_timeout
            try:
                group = Group.of(await self.control.add_group(bundle, size, within, self.adapters, old.role))
            except APIError as exc:
                raise StepFailed(exc.message) from None
            step.group = group.name
            step.detail = f"{group.name} ({', '.join(m.name for m in group.members)}) READY on {bundle.name}"
            return group

        group: Group = await self._step("START", label, start)
        try:
            await self._step("VERIFY", group.name, lambda s: self._verify_new(s, group))
            await self._step("ROUTED", group.name, lambda s: self._wait_routed(s, group.engines, True))
        except StepFailed:
            await self._step("RETIRE", group.name, lambda s: self._retire(s, group))
            raise
        return group

    async def _take_down(self, old: Group) -> None:
        self._old_engines.difference_update(old.engines)
        await self._step("DRAIN", old.name, lambda s: self._drain(s, old))
        await self._step("RETIRE", old.name, lambda s: self._retire(s, old))
        await self._step("GONE", old.name, lambda s: self._wait_routed(s, old.engines, False))

    async def _verify_new(self, step: Step, group: Group) -> None:
        states = await self._group_states(group)
        fingerprint = await self._group_fingerprint(group, states)
        self.fingerprints[group.name] = fingerprint
        self.pairings[group.name] = states[0].pairing
        model = states[0].engine.model or ""
        keyed = self.access.engine_headers()
        smokes = await asyncio.gather(*(smoke(engine, model, keyed) for engine in group.engines))
        bad = [
            f"{e}: {s.check.detail}"
            for e, s in zip(group.engines, smokes, strict=True)
            if s.check.verdict == FAIL
        ]
        if bad:
            raise StepFailed("smoke failed on " + "; ".join(bad))
        # the streamed smoke is the new engine's first request through the rollout: its warmup TTFT
        self.warmup_ttft_ms.update(
            {e: s.ttft_ms for e, s in zip(group.engines, smokes, strict=True) if s.ttft_ms is not None}
        )
        before = {self.fingerprints[name] for name in self.from_bundles if name in self.fingerprints}
        same = " (the same fingerprint as before: this bundle change does not change the engine)"
        adapters = await self._check_adapters(group)
        step.detail = (
            f"fingerprint {fingerprint}{same if fingerprint in before else ''}; smoke passed on {len(smokes)}"
            f"; {adapters}"
        )
        step.data = {"fingerprint": fingerprint, "model": model, "adapters": sorted(self.adapters)}

    async def _retire(self, step: Step, group: Group) -> None:
        try:
            retired = await self.control.retire_group(group.name, self.settings.drain_timeout)
        except APIError as exc:
            raise StepFailed(exc.message) from None
        step.detail = "stopped " + ", ".join(
            f"{name} ({'exit code ' + str(code) if code is not None else 'no exit code'})"
            for name, code in retired.exit_codes.items()
        )
