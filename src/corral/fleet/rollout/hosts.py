"""A rollout across hosts listed with their supervisor URLs, whose processes Corral does not start
itself (systemd units, bare-metal nodes): each supervisor is one serving group (its engine with all its
ranks), switched in place to a bundle declared on that host (`corral supervise --bundle FILE`).

There is no spare host to surge into, so `max_unavailable` supervisors are switched at a time
(`max_surge` does not apply). For each:

    SWITCH    the supervisor's own runbook operation (POST /v1/bundle): out of routing (confirmed by
              every router), in-flight finished, the engine restarted on the bundle, the full startup,
              smoke and readiness; on any failure its RECOVER puts the old bundle back
    VERIFY    READY on the target bundle, with a fingerprint
    ROUTED    the router lists the engine behind that supervisor as routable again
    CANARY    (with --canary-seconds) that host's window of real traffic against the hosts not yet
              switched, over the same seconds (fleet/rollout/canary.py); worse than the thresholds,
              or too little traffic to judge, and RECOVER switches the host back to its previous
              bundle (the same runbook operation) and the rollout stops

PRECHECK also refuses a rollout to a bundle some host has not declared, before anything moves.

A prefill/decode fleet (a host's role and pairing identity from its supervisor's /v1/state) moves in
the waves of fleet/rollout/pd_plan.py planned without surge (paired.plan_groups, again before each wave
once a switched host reported the target's identity): PRECHECK refuses a plan that cannot keep a
complete compatible pair and --min-prefill/--min-decode. Each wave: PAIRS (paired.check_pairs: the
router's /v1/fleet without the wave's hosts keeps them), the wave's prefill hosts switched, then its
decode hosts (a prefill drain waits for its held transfers, which decode engines still routed pull),
PAIRS after the wave; a failed switch or canary switches the wave's already switched hosts back
(RECOVER) and the rollout stops.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from corral.bundle_spec import BundleSpec
from corral.clients.calls import APIError
from corral.clients.supervisor import OperationStillRunning
from corral.contracts.operations import SwitchBundleRequest
from corral.contracts.supervisor import SupervisorState
from corral.contracts.up import GroupMember
from corral.fleet.rollout.base import RolloutBase
from corral.fleet.rollout.paired import check_pairs, plan_groups
from corral.fleet.rollout.pd_plan import BOTH, DECODE, PREFILL, PairLimits, has_roles
from corral.fleet.rollout.steps import Group, RolloutJob, Step, StepFailed, StepObserver


class HostRollout(RolloutBase):
    def __init__(
        self,
        supervisors: list[str],
        session: aiohttp.ClientSession,
        job: RolloutJob,
        observer: StepObserver | None = None,
    ) -> None:
        super().__init__(session, job, observer)
        self.supervisor_urls = [u.rstrip("/") for u in supervisors]
        self._declared_by: dict[str, list[str]] = {}  # host group -> the bundles its supervisor declares
        self._unmoved: set[str] = set()  # supervisors still on their bundle: a canary's baseline

    @property
    def batch(self) -> int:
        return self.settings.max_unavailable or 1

    async def _groups(self) -> list[Group]:
        states = await asyncio.gather(*(self._state(u) for u in self.supervisor_urls))
        groups = []
        for i, (url, state) in enumerate(zip(self.supervisor_urls, states, strict=True)):
            name, role = f"host-{i}", state.role or BOTH
            self._declared_by[name] = list(state.bundles_declared)
            member = GroupMember(
                name=name, group=name, supervisor=url, engine=state.engine.url or "", role=role
            )
            groups.append(Group(name, BundleSpec(name=state.bundle_name or "initial"), [member], role))
        return groups

    @property
    def limits(self) -> PairLimits:
        return PairLimits(self.settings.min_prefill, self.settings.min_decode)

    async def _precheck(self, step: Step) -> list[Group]:
        todo = await super()._precheck(step)
        lacking = [
            f"{g.name} ({g.supervisors[0]}: declares {self._declared(g)})"
            for g in todo
            if self.target.name not in self._declared(g)
        ]
        if lacking:
            raise StepFailed(
                f"bundle {self.target.name!r} is not declared on {', '.join(lacking)}; "
                "add `--bundle FILE` to those supervisors first"
            )
        self._unmoved = {g.supervisors[0] for g in todo}
        groups = await self._groups()
        if has_roles(g.role for g in groups):
            waves = plan_groups(
                groups, self.pairings, {g.name for g in todo}, self.batch, False, self.limits, True
            )
            step.data["plan"] = [
                {"groups": list(w.groups), "together": w.together, "lowest": w.lowest.to_json()}
                for w in waves
            ]
            step.detail += "; P/D waves: " + " then ".join("+".join(w.groups) for w in waves)
        return todo

    async def _move_all(self, todo: list[Group]) -> None:
        groups = await self._groups()
        if not has_roles(g.role for g in groups):
            await super()._move_all(todo)
            return
        remaining = {g.name: g for g in todo}
        n = 0
        while remaining:
            if n:  # the hosts switched so far publish the target's pairing identity (read at VERIFY)
                groups = await self._groups()
            wave = plan_groups(groups, self.pairings, set(remaining), self.batch, False, self.limits, True)[0]
            n += 1
            await self._move_wave(f"wave {n}", [remaining.pop(name) for name in wave.groups])

    async def _move_wave(self, label: str, olds: list[Group]) -> None:
        """PAIRS without the wave's hosts, its prefill hosts switched and then its decode hosts, PAIRS
        after; on a failure, the wave's hosts already switched go back to their bundle."""
        leaving = {u for g in olds for u in (*g.supervisors, *g.engines)}
        admin, limits = self._router_admin, self.limits
        await self._step("PAIRS", label, lambda s: check_pairs(admin, limits, s, leaving, "without the wave"))
        switched: list[Group] = []
        for roles in ((PREFILL,), (BOTH,), (DECODE,)):
            now = [g for g in olds if g.role in roles]
            moved = await asyncio.gather(*(self._move(g) for g in now), return_exceptions=True)
            switched += [g for g, m in zip(now, moved, strict=True) if not isinstance(m, BaseException)]
            failed = next((m for m in moved if isinstance(m, BaseException)), None)
            if failed is not None:
                await asyncio.gather(*(self._recover(g) for g in switched), return_exceptions=True)
                raise failed
        await self._step("PAIRS", label, lambda s: check_pairs(admin, limits, s, set(), "after the wave"))

    async def _recover(self, group: Group) -> None:
        """RECOVER: a host of a wave that cannot go on, back on the bundle it ran before."""
        if group.bundle is not None:
            back, supervisor = group.bundle.name, group.supervisors[0]
            await self._step("RECOVER", group.name, lambda s: self._switch_back(s, supervisor, back))

    def _declared(self, group: Group) -> list[str]:
        return self._declared_by.get(group.name, [])

    def _is_target(self, group: Group) -> bool:
        return group.bundle is not None and group.bundle.name == self.target.name

    async def _move(self, old: Group) -> None:
        supervisor = old.supervisors[0]
        self._unmoved.discard(supervisor)
        target = self.target.name
        await self._step("SWITCH", old.name, lambda s: self._switch(s, supervisor, target))
        await self._step("VERIFY", old.name, lambda s: self._verify_switched(s, old))
        await self._step("ROUTED", old.name, lambda s: self._wait_supervised_routed(s, supervisor))
        await self._watch_canary(old, supervisor)
        self.replaced.append({"old": old.name, "new": old.name, "fingerprint": self.fingerprints[old.name]})

    async def _watch_canary(self, group: Group, supervisor: str) -> None:
        """CANARY for a switched host (nothing without --canary-seconds); a failed one switches the
        host back to the bundle it ran before and goes on up."""
        if not self.settings.canary.seconds:
            return
        try:
            await self._step("CANARY", group.name, lambda s: self._host_canary(s, supervisor))
        except StepFailed:
            if group.bundle is not None:
                back = group.bundle.name
                await self._step("RECOVER", group.name, lambda s: self._switch_back(s, supervisor, back))
            raise

    async def _switch_back(self, step: Step, supervisor: str, bundle: str) -> None:
        """The host on the bundle it ran before, and routed again."""
        await self._switch(step, supervisor, bundle, "back")
        switched = step.detail
        await self._wait_supervised_routed(step, supervisor)
        step.detail = f"{switched}; {step.detail}"

    async def _host_canary(self, step: Step, supervisor: str) -> None:
        listed = (await self._router_endpoints()).values()
        new = [e.url for e in listed if e.supervisor_url == supervisor]
        old = [e.url for e in listed if e.supervisor_url in self._unmoved]
        await self._canary(step, new, old)

    async def _switch(self, step: Step, supervisor: str, bundle: str, why: str = "switch") -> None:
        client, op_id = self.supervisor(supervisor), f"{self.id}-{why}"
        request = SwitchBundleRequest(
            name=bundle, operation_id=op_id, ready_timeout=self.settings.start_timeout
        )
        try:
            record, _ = await client.start(request)
        except APIError as exc:
            if exc.unreachable:
                raise
            raise StepFailed(f"{supervisor} refused the switch: {exc.status} {exc.message}") from None
        within = self.settings.start_timeout + self.settings.drain_timeout
        try:
            if not record.done:
                record = await client.wait_for_operation(op_id, within=within)
        except OperationStillRunning:
            raise StepFailed(
                f"{supervisor}: the switch is still running; see its /v1/operations/{op_id}"
            ) from None
        steps = record.steps
        step.data = {"operation": op_id, "steps": [(s.step, s.status, s.seconds) for s in steps]}
        # the switch's own change record (its forced exits go into the rollout's record)
        step.data["change_record"] = (record.result or {}).get("change_record")
        if not record.succeeded:
            raise StepFailed(f"{supervisor}: {record.error}")
        step.detail = f"{supervisor} switched to {bundle}: " + ", ".join(
            f"{s.step} {s.seconds:.2f}s" for s in steps
        )

    async def _verify_switched(self, step: Step, group: Group) -> None:
        state: SupervisorState = await self._state(group.supervisors[0])
        if state.bundle_name != self.target.name:
            raise StepFailed(f"{group.name} runs bundle {state.bundle_name!r}, not {self.target.name!r}")
        fingerprint = await self._group_fingerprint(group, [state])
        # the supervisor keeps its desired set across a switch and reloads it before READY
        lost = sorted(self.group_adapters.get(group.name, set()) - set(state.adapters.served))
        if lost:
            raise StepFailed(f"{group.name} no longer serves adapter(s) {lost} it served before the switch")
        before = self.fingerprints.get(group.name)
        self.fingerprints[group.name] = fingerprint
        self.pairings[group.name] = state.pairing
        same = " (unchanged: this bundle starts the same engine)" if fingerprint == before else ""
        step.detail = f"READY on {self.target.name}, fingerprint {fingerprint}{same}"
        step.data = {"fingerprint": fingerprint, "before": before}

    async def _wait_supervised_routed(self, step: Step, supervisor: str) -> None:
        deadline = time.monotonic() + self.settings.routed_timeout
        while True:
            listed = await self._router_endpoints()
            mine = [e for e in listed.values() if e.supervisor_url == supervisor]
            if mine and all(e.routable for e in mine):
                step.detail = f"router routes {', '.join(e.url for e in mine)}"
                return
            if time.monotonic() >= deadline:
                why = "; ".join(f"{e.url}: {e.why}" for e in mine) or "not listed"
                within = self.settings.routed_timeout
                raise StepFailed(f"router did not route {supervisor}'s engine within {within:g}s: {why}")
            await asyncio.sleep(0.1)
