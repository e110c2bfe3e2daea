"""What every rollout shares, whatever runs the fleet's processes: the steps' timing and record,
PRECHECK's and POSTCHECK's looks at the fleet, a group's fingerprint, the router checks and a
group's confirmed drain. Subclasses say how a serving group is moved (`_move`)."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp

from corral.bundle_spec import bundle_record
from corral.clients.access import RouterAdminError
from corral.clients.calls import APIError
from corral.clients.router import RouterAdminClient
from corral.clients.supervisor import OperationStillRunning, SupervisorClient
from corral.contracts.fleet_adapters import AdapterConflict, fleet_adapter_set
from corral.contracts.operations import DrainRequest
from corral.contracts.records import RolloutRecord
from corral.contracts.router import FleetEndpoint
from corral.contracts.supervisor import SupervisorState
from corral.contracts.traffic import WindowVerdict
from corral.engine.gauge_source import sample_engines
from corral.engine_state import EngineState
from corral.fleet.checks.adapters import KeptAdapters
from corral.fleet.checks.probe import FleetTarget, look
from corral.fleet.checks.verify import FAIL, Expectations, run_checks
from corral.fleet.engine_memory import memory_of
from corral.fleet.rollout import canary
from corral.fleet.rollout.record import RecordReadings, rollout_record
from corral.fleet.rollout.steps import Group, RolloutJob, Step, StepFailed, StepObserver

_SHORT = aiohttp.ClientTimeout(total=5)
_STATE_SECONDS = 5.0  # one supervisor's /v1/state

T = TypeVar("T")


class RolloutBase:
    def __init__(
        self, session: aiohttp.ClientSession, job: RolloutJob, observer: StepObserver | None = None
    ) -> None:
        settings = job.settings
        if settings.max_surge < 0 or settings.max_unavailable < 0 or settings.batch < 1:
            raise ValueError("max_surge or max_unavailable must be at least 1 (and neither negative)")
        self.session, self.router = session, job.router.rstrip("/")
        self.target, self.settings, self.kind = job.target, settings, job.kind
        self.id = f"{job.kind}-{uuid.uuid4().hex[:10]}"
        self._token, self.access = job.supervisor_token, job.access
        self._router_admin = RouterAdminClient(session, job.access.router_admin(self.router))
        self._observer = observer
        self.steps: list[Step] = []
        self.from_bundles: dict[str, dict[str, Any]] = {}
        self.replaced: list[dict[str, str]] = []
        self.fingerprints: dict[str, str] = {}
        # each group's P/D pairing identity as its supervisors publish it (None: not known)
        self.pairings: dict[str, str | None] = {}
        # the fleet's desired LoRA set at PRECHECK (name -> path), which every new group loads
        self.adapters: dict[str, str] = {}
        self.group_adapters: dict[str, set[str]] = {}  # each group's desired adapters at PRECHECK
        self.failure: Step | None = None  # the first step that failed
        # issue 15: filled by the CANARY step (one verdict per new group that had a canary) and by the
        # new groups' VERIFY (each new engine's first request's TTFT, ms); the record keeps both
        self.canary: list[WindowVerdict] = []
        self.warmup_ttft_ms: dict[str, float] = {}
        # the router's totals and each engine's memory, read at PRECHECK and at the end (the record's)
        self.readings = RecordReadings(self._router_admin)
        self.rollback_command, self.undoes = job.rollback_command, job.undoes

    @property
    def batch(self) -> int:
        """How many serving groups move at once."""
        return self.settings.batch

    def _is_target(self, group: Group) -> bool:
        return group.bundle == self.target

    async def _groups(self) -> list[Group]:
        raise NotImplementedError

    async def _move(self, old: Group) -> None:
        raise NotImplementedError

    def supervisor(self, url: str) -> SupervisorClient:
        return SupervisorClient(self.session, url, self._token, timeout=_STATE_SECONDS)

    # -- the record ---------------------------------------------------------------------------

    async def record(self, outcome: str, reason: str, started: float) -> RolloutRecord:
        """The change record: the fleet read once more (router totals, memory), then every section
        assembled (fleet/rollout/record.py)."""
        await self.readings.at_end(self._groups, lambda url: self._state(url))
        return rollout_record(self, outcome, reason, started)

    async def _step(self, name: str, group: str | None, body: Callable[[Step], Awaitable[T]]) -> T:
        """Run one step, timing it; a StepFailed (or a network error) marks it failed and goes on up."""
        step = Step(name, group)
        self.steps.append(step)
        if self._observer is not None:
            self._observer(step, False)
        started = time.monotonic()
        try:
            result = await body(step)
            step.ok = True
            return result
        except (aiohttp.ClientError, TimeoutError) as exc:
            step.detail = f"{type(exc).__name__}: {exc}".rstrip(": ")
            self.failure = self.failure or step
            raise StepFailed(step.detail) from exc
        except (StepFailed, APIError) as exc:
            step.detail = str(exc)
            self.failure = self.failure or step
            raise StepFailed(step.detail) from exc
        finally:
            step.seconds = time.monotonic() - started
            if self._observer is not None:
                self._observer(step, True)

    # -- the whole ----------------------------------------------------------------------------

    async def run(self) -> RolloutRecord:
        started = time.time()
        try:
            todo = await self._step("PRECHECK", None, self._precheck)
            await self._move_all(todo)
            postcheck = await self._step("POSTCHECK", None, self._postcheck)
        except StepFailed as exc:
            failed = self.failure
            where = f"{failed.step} {failed.group or ''}".strip() if failed else "?"
            detail = failed.detail if failed else str(exc)
            untouched = f"; groups not reached keep serving on their bundle: {self._serving_note()}"
            return await self.record("failed", f"{where}: {detail}{untouched}", started)
        reason = postcheck if todo else f"every group already runs {self.target.name}; {postcheck}"
        return await self.record("succeeded", reason, started)

    async def _move_all(self, todo: list[Group]) -> None:
        """Every group of `todo`, `batch` at a time."""
        for i in range(0, len(todo), self.batch):
            batch = todo[i : i + self.batch]
            # every move of the batch runs to its end (or its own RECOVER) before a failure is
            # reported: none is left half done behind the record
            moved = await asyncio.gather(*(self._move(g) for g in batch), return_exceptions=True)
            for outcome in moved:
                if isinstance(outcome, BaseException):
                    raise outcome

    def _serving_note(self) -> str:
        done = {r["old"] for r in self.replaced}
        left = [name for name in self.from_bundles if name not in done]
        return ", ".join(f"{n} ({self.from_bundles[n].get('name')})" for n in left) or "none"

    async def _precheck(self, step: Step) -> list[Group]:
        async with self.session.get(self.router + "/health", timeout=_SHORT) as r:
            health = await r.json(content_type=None)
            if r.status != 200:
                raise StepFailed(f"router {self.router} /health {r.status}: {health}; fix the fleet first")
        groups = await self._groups()
        if not groups:
            raise StepFailed("the fleet has no serving groups")
        states = await asyncio.gather(*(self._group_states(g) for g in groups))
        await self.readings.at_start(groups, states)
        for group, group_states in zip(groups, states, strict=True):
            self.fingerprints[group.name] = await self._group_fingerprint(group, group_states)
            self.pairings[group.name] = group_states[0].pairing if group_states else None
            self.from_bundles[group.name] = bundle_record(group.bundle) if group.bundle else {}
            self.group_adapters[group.name] = {n for s in group_states for n in s.adapters.desired}
        try:
            self.adapters = fleet_adapter_set(
                (m.name, s)
                for g, ss in zip(groups, states, strict=True)
                for m, s in zip(g.members, ss, strict=True)
            )
        except AdapterConflict as exc:
            raise StepFailed(str(exc)) from None
        unrouted = self._unrouted(groups, await self._router_endpoints())
        if unrouted:
            raise StepFailed(
                f"the router does not route {', '.join(unrouted)}; a rollout would start short of "
                "capacity: find out why first (`corral doctor`)"
            )
        todo = [g for g in groups if not self._is_target(g)]
        carried = f"; adapters to carry: {', '.join(self.adapters)}" if self.adapters else ""
        step.detail = (
            f"router routes all {sum(len(g.members) for g in groups)} engines; {len(groups)} groups READY, "
            f"one fingerprint each; {len(todo)} to move to {self.target.name}{carried}"
        )
        step.data = {"groups": {g.name: self.fingerprints[g.name] for g in groups}, "adapters": self.adapters}
        return todo

    @staticmethod
    def _unrouted(groups: list[Group], listed: dict[str, FleetEndpoint]) -> list[str]:
        """Members the router does not route now, matched by engine URL or by supervisor URL."""
        routable_supervisors = {e.supervisor_url for e in listed.values() if e.routable}
        return [
            m.name
            for g in groups
            for m in g.members
            if not (m.engine in listed and listed[m.engine].routable)
            and m.supervisor not in routable_supervisors
        ]

    async def _postcheck(self, step: Step) -> str:
        groups = await self._groups()
        target = FleetTarget(
            self.router,
            [(m.name, m.supervisor) for g in groups for m in g.members],
            self._token,
            self.access,
        )
        kept = KeptAdapters(frozenset(self.adapters), f"{self.kind} {self.id} PRECHECK")
        checks, ttft = await run_checks(await look(target), Expectations(kept_adapters=kept), None)
        step.data = {"checks": [c.to_json() for c in checks], "ttft_ms": ttft}
        failed = [c for c in checks if c.verdict == FAIL]
        if failed:
            raise StepFailed("verify: " + "; ".join(f"{c.name}: {c.detail}" for c in failed))
        step.detail = f"verify: {len(checks)} checks, none failed"
        return step.detail

    # -- steps --------------------------------------------------------------------------------

    async def _state(self, supervisor: str) -> SupervisorState:
        try:
            return await self.supervisor(supervisor).state()
        except APIError as exc:
            if exc.unreachable:
                raise
            raise StepFailed(f"{supervisor}/v1/state answered {exc.status}: {exc.message}") from None

    async def _group_states(self, group: Group) -> list[SupervisorState]:
        return list(await asyncio.gather(*(self._state(s) for s in group.supervisors)))

    async def _group_fingerprint(self, group: Group, states: list[SupervisorState] | None = None) -> str:
        """The group's one fingerprint, from its members' states (asked for when not given);
        StepFailed if a member is not READY or they differ."""
        states = states if states is not None else await self._group_states(group)
        seen: dict[str, list[str]] = {}
        for member, state in zip(group.members, states, strict=True):
            if state.state is not EngineState.READY:
                raise StepFailed(f"{member.name} of {group.name} is {state.state}: {state.reason}")
            if not state.fingerprint:
                raise StepFailed(f"{member.name} of {group.name} is READY without a bundle fingerprint")
            seen.setdefault(state.fingerprint, []).append(member.name)
        if len(seen) != 1:
            raise StepFailed(f"{group.name} mixes fingerprints: {seen}")
        return next(iter(seen))

    async def _check_adapters(self, group: Group) -> str:
        """Every carried adapter in each of the group's engines' own /v1/models (asked directly, with
        the engines' key): StepFailed naming the adapter and the engine that lacks it."""
        if not self.adapters:
            return "no adapters to carry"
        headers = self.access.engine_headers()
        for member in group.members:
            async with self.session.get(member.engine + "/v1/models", headers=headers, timeout=_SHORT) as r:
                body = await r.json(content_type=None)
                if r.status != 200:
                    raise StepFailed(f"{member.name} {member.engine}/v1/models answered {r.status}: {body}")
            served = {str(m.get("id")) for m in body.get("data") or [] if m.get("parent")}
            missing = sorted(set(self.adapters) - served)
            if missing:
                raise StepFailed(
                    f"{member.name} does not serve adapter(s) {missing} of the fleet "
                    f"({', '.join(f'{n}={self.adapters[n]}' for n in missing)})"
                )
        return f"adapters {', '.join(self.adapters)} served by all {len(group.members)}"

    async def _router_endpoints(self) -> dict[str, FleetEndpoint]:
        try:
            return await self._router_admin.endpoints()
        except RouterAdminError as exc:
            raise StepFailed(str(exc)) from None

    async def _wait_routed(self, step: Step, engines: list[str], routable: bool) -> None:
        """Until the router routes every one of `engines` (or, for False, lists none of them)."""
        deadline = time.monotonic() + self.settings.routed_timeout
        while True:
            listed = await self._router_endpoints()
            if routable:
                missing = [e for e in engines if not (e in listed and listed[e].routable)]
            else:
                missing = [e for e in engines if e in listed]
            if not missing:
                step.detail = f"router {'routes' if routable else 'no longer lists'} {', '.join(engines)}"
                return
            if time.monotonic() >= deadline:
                why = "; ".join(f"{e}: {listed[e].why if e in listed else 'not listed'}" for e in missing)
                verb = "route" if routable else "drop"
                raise StepFailed(f"router did not {verb} within {self.settings.routed_timeout:g}s: {why}")
            await asyncio.sleep(0.1)

    async def _canary(self, step: Step, new: list[str], old: list[str]) -> None:
        """CANARY: the `new` engines' window of real traffic against the `old` ones' over the same
        seconds (fleet/rollout/canary.py); the verdict is kept whatever it is, and anything but
        passed fails the step with the figures."""
        settings = self.settings.canary
        try:
            memory = await self._engine_memory(await self._router_endpoints(), [*new, *old])
            sample = functools.partial(sample_engines, self.session, memory=memory)
            verdict = await canary.watch(self._router_endpoints, new, old, settings, sample)
        except canary.CanaryBlind as exc:
            raise StepFailed(str(exc)) from None
        self.canary.append(verdict)
        step.data = {"verdict": verdict.to_wire(), "new": list(new), "old": list(old)}
        why = canary.failure(verdict, step.group or "the new group", settings)
        if why is not None:
            raise StepFailed(why)
        step.detail = canary.summary(verdict, step.group or "the new group")

    async def _engine_memory(
        self, listed: dict[str, FleetEndpoint], engines: list[str]
    ) -> dict[str, float | str]:
        """Each engine's GPU memory as its supervisor last measured it (NVML, or the simulator's
        gauges; `/v1/state` `memory.last`), by engine URL, or why not: what the canary judges where
        the engine's /metrics shows none (a real vLLM)."""

        async def one(url: str) -> float | str:
            endpoint = listed.get(url)
            if endpoint is None or not endpoint.supervisor_url:
                return "no supervisor known for it (the router lists none)"
            try:
                state = await self._state(endpoint.supervisor_url)
            except (StepFailed, APIError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                return f"its supervisor did not answer: {exc}"
            figure, why = memory_of(state)
            return float(figure.held_bytes) if figure is not None else f"its supervisor: {why}"

        urls = sorted(set(engines))
        return dict(zip(urls, await asyncio.gather(*(one(u) for u in urls)), strict=True))

    async def _drain(self, step: Step, group: Group) -> None:
        """Each member's confirmed drain, through its supervisor, concurrently; every report kept."""
        reports = await asyncio.gather(*(self._drain_one(s) for s in group.supervisors))
        step.data = {"reports": dict(zip((m.name for m in group.members), reports, strict=True))}
        unacked = [r for r in reports if r.get("routers_missing")]
        step.detail = f"{len(reports)} drained; routers acknowledged after " + ", ".join(
            f"{r.get('acknowledged_after_s') or 0:.3f}s" for r in reports
        )
        if unacked:
            step.detail += (
                f"; NOT acknowledged by {sorted({m for r in unacked for m in r['routers_missing']})}"
            )

    async def _drain_one(self, supervisor: str) -> dict[str, Any]:
        """The supervisor's drain report, as it sent it (kept whole in the change record)."""
        client, op_id = self.supervisor(supervisor), f"{self.id}-drain"
        try:
            record, _ = await client.start(DrainRequest(operation_id=op_id))
        except APIError as exc:
            if exc.unreachable:
                raise
            raise StepFailed(f"{supervisor} refused the drain: {exc.status} {exc.message}") from None
        try:
            if not record.done:
                record = await client.wait_for_operation(op_id, within=self.settings.drain_timeout)
        except OperationStillRunning:
            raise StepFailed(
                f"{supervisor}: drain still running after {self.settings.drain_timeout:g}s"
            ) from None
        if not record.succeeded:
            raise StepFailed(f"{supervisor}: drain failed: {record.error}")
        return record.result or {}
