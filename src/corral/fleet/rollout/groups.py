"""`corral rollout` and `corral rollback`: move a fleet that Corral runs to another bundle, one batch of
serving groups at a time, without dropping a request.

For each serving group still on another bundle, with surge (`max_surge` > 0, the default):

    START     a new group from the target bundle; its supervisors run the full startup, smoke and
              readiness (all or nothing: a member that fails takes the whole new group down)
    VERIFY    every new member READY, one fingerprint in the group, a streamed and a non-streamed
              smoke request straight to each new engine (usage and finish reason)
    ROUTED    the router lists every new engine as routable (checked on its /v1/fleet, not assumed)
    DRAIN     the old group's confirmed drain: every router acknowledged the removal, in-flight
              requests finished, the engine stopped (the supervisor's drain report is kept)
    RETIRE    the old group's processes stopped and gone from the router's backends
    GONE      the router no longer lists the old engines

Without surge (`max_unavailable` > 0), DRAIN and RETIRE come first; a new group that then fails is
replaced by RECOVER: the group's previous bundle started again the same way.

PRECHECK comes first (router answering, every group READY with one fingerprint), POSTCHECK last (the
whole `corral verify` checklist). Any failure stops the rollout where it is: groups not yet touched keep
serving on their bundle, the new group that failed is stopped, and the change record says which step
failed and why. The change record lists every step with its start time and duration.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from corral.bundle_spec import BundleSpec, bundle_from_json
from corral.clients.access import FleetAccess, RouterAdminError
from corral.fleet.checks.probe import FleetTarget, look
from corral.fleet.checks.verify import FAIL, Expectations, run_checks, smoke

_SHORT = aiohttp.ClientTimeout(total=5)


class StepFailed(Exception):
    """A rollout step did not reach its verified end; the message says what was seen."""


@dataclass(frozen=True)
class RolloutSettings:
    max_surge: int = 1  # serving groups started beyond the fleet's size at once
    max_unavailable: int = 0  # serving groups taken out before their replacement is up
    routed_timeout: float = 30.0  # for the router to list a new engine as routable, or drop an old one
    drain_timeout: float = 300.0  # for one group's confirmed drain (the supervisors bound each step)
    start_timeout: float = 600.0  # for one group's start (the fleet's own startup timeout applies too)
    # for RECOVER's start of the previous bundle: known to work, so given time even when the new
    # bundle's start timeout is short
    recover_timeout: float = 600.0

    @property
    def batch(self) -> int:
        return self.max_surge or self.max_unavailable


@dataclass
class Step:
    step: str
    group: str | None
    started: float = field(default_factory=time.time)
    seconds: float = 0.0
    ok: bool = False
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "group": self.group,
            "started": self.started,
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "detail": self.detail,
            **({"data": self.data} if self.data else {}),
        }


StepObserver = Callable[[Step, bool], None]  # (step, finished)


@dataclass
class Group:
    name: str
    bundle: BundleSpec | None
    members: list[dict[str, Any]]

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Group:
        raw = body.get("bundle")
        bundle = bundle_from_json(raw, f"group {body.get('name')}") if raw else None
        return cls(str(body["name"]), bundle, list(body.get("members") or []))

    @property
    def supervisors(self) -> list[str]:
        return [str(m["supervisor"]) for m in self.members]

    @property
    def engines(self) -> list[str]:
        return [str(m["engine"]) for m in self.members]


class FleetControlClient:
    """The control API of a running `corral up` (corral.fleet.local.control)."""

    def __init__(self, session: aiohttp.ClientSession, url: str, token: str) -> None:
        self._session, self.url = session, url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}

    async def groups(self) -> list[Group]:
        async with self._session.get(self.url + "/v1/groups", headers=self._headers, timeout=_SHORT) as r:
            body = await r.json(content_type=None)
            if r.status != 200:
                raise StepFailed(f"fleet control {self.url}: {r.status} {message_of(body)}")
        return [Group.from_json(g) for g in body["groups"]]

    async def add_group(self, bundle: BundleSpec, size: int, within: float) -> Group:
        timeout = aiohttp.ClientTimeout(total=within + 60)  # the fleet stops a failed group first
        body = {"bundle": bundle.to_json(), "size": size, "startup_timeout": within}
        async with self._session.post(
            self.url + "/v1/groups", json=body, headers=self._headers, timeout=timeout
        ) as r:
            answer = await r.json(content_type=None)
            if r.status != 201:
                raise StepFailed(message_of(answer))
        return Group.from_json(answer)

    async def retire_group(self, name: str, within: float) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=within)
        url = f"{self.url}/v1/groups/{name}"
        async with self._session.delete(url, headers=self._headers, timeout=timeout) as r:
            answer: dict[str, Any] = await r.json(content_type=None)
            if r.status != 200:
                raise StepFailed(message_of(answer))
        return answer


def message_of(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message"))
    return str(body)[:300]


@dataclass(frozen=True)
class RolloutJob:
    """What a rollout (or rollback) is asked to do, whatever runs the fleet's processes."""

    router: str
    target: BundleSpec
    settings: RolloutSettings
    kind: str = "rollout"  # or "rollback"
    supervisor_token: str | None = field(default=None, repr=False)  # where supervisors want one
    access: FleetAccess = field(default_factory=FleetAccess)  # the router's admin side, the engines' key


class RolloutBase:
    """What every rollout shares: the steps' timing and record, PRECHECK's and POSTCHECK's looks at the
    fleet, and the router checks. Subclasses say how a serving group is moved (`_move`)."""

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
        self._router_admin = job.access.router_admin(self.router)
        self._auth = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        self._observer = observer
        self.steps: list[Step] = []
        self.from_bundles: dict[str, dict[str, Any]] = {}
        self.replaced: list[dict[str, Any]] = []
        self.fingerprints: dict[str, str] = {}
        self.failure: Step | None = None  # the first step that failed

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

    # -- the record ---------------------------------------------------------------------------

    def record(self, outcome: str, reason: str, started: float) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.id,
            "outcome": outcome,
            "reason": reason,
            "started": started,
            "finished": time.time(),
            "router": self.router,
            "to_bundle": self.target.to_json(),
            "from_bundles": self.from_bundles,
            "settings": {
                "max_surge": self.settings.max_surge,
                "max_unavailable": self.settings.max_unavailable,
            },
            "replaced": self.replaced,
            "fingerprints": self.fingerprints,
            "steps": [s.to_json() for s in self.steps],
        }

    async def _step(self, name: str, group: str | None, body: Callable[[Step], Any]) -> Any:
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
        except StepFailed as exc:
            step.detail = str(exc)
            self.failure = self.failure or step
            raise
        finally:
            step.seconds = time.monotonic() - started
            if self._observer is not None:
                self._observer(step, True)

    # -- the whole ----------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        started = time.time()
        try:
            todo = await self._step("PRECHECK", None, self._precheck)
            for i in range(0, len(todo), self.batch):
                batch = todo[i : i + self.batch]
                # every move of the batch runs to its end (or its own RECOVER) before a failure is
                # reported: none is left half done behind the record
                moved = await asyncio.gather(*(self._move(g) for g in batch), return_exceptions=True)
                for outcome in moved:
                    if isinstance(outcome, BaseException):
                        raise outcome
            postcheck = await self._step("POSTCHECK", None, self._postcheck)
        except StepFailed as exc:
            failed = self.failure
            where = f"{failed.step} {failed.group or ''}".strip() if failed else "?"
            detail = failed.detail if failed else str(exc)
            untouched = f"; groups not reached keep serving on their bundle: {self._serving_note()}"
            return self.record("failed", f"{where}: {detail}{untouched}", started)
        reason = postcheck if todo else f"every group already runs {self.target.name}; {postcheck}"
        return self.record("succeeded", reason, started)

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
        prints = await asyncio.gather(*(self._group_fingerprint(g) for g in groups))
        for group, fingerprint in zip(groups, prints, strict=True):
            self.fingerprints[group.name] = fingerprint
            self.from_bundles[group.name] = group.bundle.to_json() if group.bundle else {}
        unrouted = self._unrouted(groups, await self._router_endpoints())
        if unrouted:
            raise StepFailed(
                f"the router does not route {', '.join(unrouted)}; a rollout would start short of "
                "capacity: find out why first (`corral doctor`)"
            )
        todo = [g for g in groups if not self._is_target(g)]
        step.detail = (
            f"router routes all {sum(len(g.members) for g in groups)} engines; {len(groups)} groups READY, "
            f"one fingerprint each; {len(todo)} to move to {self.target.name}"
        )
        step.data = {"groups": {g.name: self.fingerprints[g.name] for g in groups}}
        return todo

    @staticmethod
    def _unrouted(groups: list[Group], listed: dict[str, dict[str, Any]]) -> list[str]:
        """Members the router does not route now, matched by engine URL or by supervisor URL."""
        routable_supervisors = {
            (e.get("supervisor") or {}).get("url") for e in listed.values() if e.get("routable")
        }
        return [
            str(m["name"])
            for g in groups
            for m in g.members
            if not (listed.get(str(m["engine"])) or {}).get("routable")
            and m["supervisor"] not in routable_supervisors
        ]

    async def _postcheck(self, step: Step) -> str:
        groups = await self._groups()
        target = FleetTarget(
            self.router,
            [(str(m["name"]), str(m["supervisor"])) for g in groups for m in g.members],
            self._token,
            self.access,
        )
        checks, ttft = await run_checks(await look(target), Expectations(), None)
        step.data = {"checks": [c.to_json() for c in checks], "ttft_ms": ttft}
        failed = [c for c in checks if c.verdict == FAIL]
        if failed:
            raise StepFailed("verify: " + "; ".join(f"{c.name}: {c.detail}" for c in failed))
        step.detail = f"verify: {len(checks)} checks, none failed"
        return step.detail

    # -- steps --------------------------------------------------------------------------------

    async def _state(self, supervisor: str) -> dict[str, Any]:
        async with self.session.get(supervisor + "/v1/state", headers=self._auth, timeout=_SHORT) as r:
            body: dict[str, Any] = await r.json(content_type=None)
            if r.status != 200:
                raise StepFailed(f"{supervisor}/v1/state answered {r.status}: {message_of(body)}")
        return body

    async def _group_states(self, group: Group) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(self._state(s) for s in group.supervisors)))

    async def _group_fingerprint(self, group: Group, states: list[dict[str, Any]] | None = None) -> str:
        """The group's one fingerprint, from its members' states (asked for when not given);
        StepFailed if a member is not READY or they differ."""
        states = states if states is not None else await self._group_states(group)
        seen: dict[str, list[str]] = {}
        for member, state in zip(group.members, states, strict=True):
            if state.get("state") != "READY":
                raise StepFailed(
                    f"{member['name']} of {group.name} is {state.get('state')}: {state.get('reason')}"
                )
            fingerprint = str((state.get("bundle") or {}).get("fingerprint") or "")
            if not fingerprint:
                raise StepFailed(f"{member['name']} of {group.name} is READY without a bundle fingerprint")
            seen.setdefault(fingerprint, []).append(str(member["name"]))
        if len(seen) != 1:
            raise StepFailed(f"{group.name} mixes fingerprints: {seen}")
        return next(iter(seen))

    async def _router_endpoints(self) -> dict[str, dict[str, Any]]:
        try:
            listed = await self._router_admin.endpoints(self.session)
        except RouterAdminError as exc:
            raise StepFailed(str(exc)) from None
        return {str(e["url"]): e for e in listed}

    async def _wait_routed(self, step: Step, engines: list[str], routable: bool) -> None:
        """Until the router routes every one of `engines` (or, for False, lists none of them)."""
        deadline = time.monotonic() + self.settings.routed_timeout
        while True:
            listed = await self._router_endpoints()
            if routable:
                missing = [e for e in engines if not (listed.get(e) or {}).get("routable")]
            else:
                missing = [e for e in engines if e in listed]
            if not missing:
                step.detail = f"router {'routes' if routable else 'no longer lists'} {', '.join(engines)}"
                return
            if time.monotonic() >= deadline:
                why = "; ".join(f"{e}: {(listed.get(e) or {}).get('why', 'not listed')}" for e in missing)
                verb = "route" if routable else "drop"
                raise StepFailed(f"router did not {verb} within {self.settings.routed_timeout:g}s: {why}")
            await asyncio.sleep(0.1)

    async def _drain(self, step: Step, group: Group) -> None:
        """Each member's confirmed drain, through its supervisor, concurrently; every report kept."""
        reports = await asyncio.gather(*(self._drain_one(s) for s in group.supervisors))
        step.data = {"reports": dict(zip((m["name"] for m in group.members), reports, strict=True))}
        unacked = [r for r in reports if r.get("routers_missing")]
        step.detail = f"{len(reports)} drained; routers acknowledged after " + ", ".join(
            f"{r.get('acknowledged_after_s') or 0:.3f}s" for r in reports
        )
        if unacked:
            step.detail += (
                f"; NOT acknowledged by {sorted({m for r in unacked for m in r['routers_missing']})}"
            )

    async def _drain_one(self, supervisor: str) -> dict[str, Any]:
        op_id = f"{self.id}-drain"
        async with self.session.post(
            supervisor + "/v1/drain", json={"operation_id": op_id}, headers=self._auth, timeout=_SHORT
        ) as r:
            body = await r.json(content_type=None)
            if r.status not in (200, 202):
                raise StepFailed(f"{supervisor} refused the drain: {r.status} {message_of(body)}")
        deadline = time.monotonic() + self.settings.drain_timeout
        while body.get("status") not in ("succeeded", "failed"):
            if time.monotonic() >= deadline:
                raise StepFailed(f"{supervisor}: drain still running after {self.settings.drain_timeout:g}s")
            await asyncio.sleep(0.1)
            async with self.session.get(
                f"{supervisor}/v1/operations/{op_id}", headers=self._auth, timeout=_SHORT
            ) as r:
                body = await r.json(content_type=None)
        if body.get("status") != "succeeded":
            raise StepFailed(f"{supervisor}: drain failed: {body.get('error')}")
        result: dict[str, Any] = body.get("result") or {}
        return result


class LocalRollout(RolloutBase):
    """A fleet whose processes `corral up` runs: new serving groups are started beside the old ones
    (surge) or in their place, through the fleet's control API."""

    def __init__(
        self,
        control: FleetControlClient,
        session: aiohttp.ClientSession,
        job: RolloutJob,
        observer: StepObserver | None = None,
    ) -> None:
        super().__init__(session, job, observer)
        self.control = control

    async def _groups(self) -> list[Group]:
        return await self.control.groups()

    async def _move(self, old: Group) -> None:
        size = len(old.members)
        if self.settings.max_surge:
            new = await self._bring_up(old, self.target, size)
            await self._take_down(old)
        else:
            await self._take_down(old)
            try:
                new = await self._bring_up(old, self.target, size)
            except StepFailed:
                if old.bundle is not None:
                    await self._step("RECOVER", old.name, lambda s: self._recover(s, old, size))
                raise
        self.replaced.append({"old": old.name, "new": new.name, "fingerprint": self.fingerprints[new.name]})

    async def _recover(self, step: Step, old: Group, size: int) -> None:
        assert old.bundle is not None
        group = await self._bring_up(old, old.bundle, size, recovering=True)
        step.detail = f"{group.name} started again on {old.bundle.name} in place of {old.name}"

    async def _bring_up(self, old: Group, bundle: BundleSpec, size: int, recovering: bool = False) -> Group:
        label = f"{old.name}'" if not recovering else f"{old.name} (recover)"

        async def start(step: Step) -> Group:
            within = self.settings.recover_timeout if recovering else self.settings.start_timeout
            group = await self.control.add_group(bundle, size, within)
            step.group = group.name
            step.detail = (
                f"{group.name} ({', '.join(m['name'] for m in group.members)}) READY on {bundle.name}"
            )
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
        await self._step("DRAIN", old.name, lambda s: self._drain(s, old))
        await self._step("RETIRE", old.name, lambda s: self._retire(s, old))
        await self._step("GONE", old.name, lambda s: self._wait_routed(s, old.engines, False))

    async def _verify_new(self, step: Step, group: Group) -> None:
        states = await self._group_states(group)
        fingerprint = await self._group_fingerprint(group, states)
        self.fingerprints[group.name] = fingerprint
        model = str((states[0].get("engine") or {}).get("model") or "")
        keyed = self.access.engine_headers()
        smokes = await asyncio.gather(*(smoke(engine, model, keyed) for engine in group.engines))
        bad = [
            f"{e}: {s.check.detail}"
            for e, s in zip(group.engines, smokes, strict=True)
            if s.check.verdict == FAIL
        ]
        if bad:
            raise StepFailed("smoke failed on " + "; ".join(bad))
        before = {self.fingerprints[name] for name in self.from_bundles if name in self.fingerprints}
        same = " (the same fingerprint as before: this bundle change does not change the engine)"
        step.detail = (
            f"fingerprint {fingerprint}{same if fingerprint in before else ''}; smoke passed on {len(smokes)}"
        )
        step.data = {"fingerprint": fingerprint, "model": model}

    async def _retire(self, step: Step, group: Group) -> None:
        answer = await self.control.retire_group(group.name, self.settings.drain_timeout)
        step.detail = f"stopped {answer.get('exit_codes')}"
