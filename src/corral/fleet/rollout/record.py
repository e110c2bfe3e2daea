"""A rollout's (or rollback's) change record: what it reads at PRECHECK and again at its end (the
router's request totals, each engine's memory figure) and the assembly of every section of the typed
`RolloutRecord` from those readings, the steps and their evidence."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from pydantic import ValidationError

from corral import __version__
from corral.bundle_spec import BundleSpec, bundle_record
from corral.clients.access import RouterAdminError
from corral.clients.calls import APIError
from corral.clients.router import RouterAdminClient
from corral.contracts.operations import DrainResult, ForcedExit
from corral.contracts.records import (
    LatencyRecord,
    MemoryDelta,
    RequestFailures,
    RollbackPoint,
    RolloutRecord,
    StepRecord,
)
from corral.contracts.supervisor import SupervisorState
from corral.contracts.traffic import RequestCounts, WindowVerdict
from corral.engine.graph_nccl_flags import bundle_settings, changed_settings
from corral.fleet.engine_memory import EngineMemory, memory_of
from corral.fleet.rollout.steps import Group, RolloutSettings, Step, StepFailed

StateOf = Callable[[str], Awaitable[SupervisorState]]  # a supervisor's /v1/state, by its URL


@dataclass
class Reading:
    """One look at the fleet for the record: the router's totals and each engine's memory."""

    groups: dict[str, list[str]] = field(default_factory=dict)  # group -> its members' names, in order
    totals: RequestCounts | None = None
    totals_missing: str = ""  # why `totals` is None
    memory: dict[str, EngineMemory] = field(default_factory=dict)
    memory_missing: dict[str, str] = field(default_factory=dict)  # engine -> why it has no figure


class RecordReadings:
    """The record's two readings: `start` at PRECHECK (before anything moves), `end` once the rollout
    has finished, succeeded or failed. A reading that could not be made stays None and says why."""

    def __init__(self, admin: RouterAdminClient) -> None:
        self._admin = admin
        self.start: Reading | None = None
        self.end: Reading | None = None
        self.end_missing = ""

    async def at_start(self, groups: list[Group], states: list[list[SupervisorState]]) -> None:
        """From the states PRECHECK read already, and the router's totals read now."""
        reading = Reading()
        reading.totals, reading.totals_missing = await self._totals()
        for group, group_states in zip(groups, states, strict=True):
            self._note(reading, group, group_states)
        self.start = reading

    async def at_end(self, groups: Callable[[], Awaitable[list[Group]]], state_of: StateOf) -> None:
        """The fleet as it is now: its groups, each member's state (one unreachable member is a
        missing figure, not a missing reading) and the router's totals. Never raises."""
        reading = Reading()
        reading.totals, reading.totals_missing = await self._totals()
        try:
            now = await groups()
        except (StepFailed, APIError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.end_missing = f"the fleet's groups could not be read at the end: {exc}"
            now = []
        asked = [state_of(u) for group in now for u in group.supervisors]  # all at once: one timeout at most
        answers = iter(await asyncio.gather(*asked, return_exceptions=True))
        for group in now:
            self._note(reading, group, [next(answers) for _ in group.members])
        self.end = reading

    @staticmethod
    def _note(reading: Reading, group: Group, states: Sequence[SupervisorState | BaseException]) -> None:
        reading.groups[group.name] = [m.name for m in group.members]
        for member, state in zip(group.members, states, strict=True):
            if isinstance(state, BaseException):
                reading.memory_missing[member.name] = f"its supervisor did not answer: {state}"
                continue
            figure, why = memory_of(state)
            if figure is not None:
                reading.memory[member.name] = figure
            else:
                reading.memory_missing[member.name] = why

    async def _totals(self) -> tuple[RequestCounts | None, str]:
        try:
            fleet = await self._admin.fleet()
        except (RouterAdminError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            return None, f"the router's /v1/fleet did not answer: {exc}"
        if fleet.totals is None:
            return None, "the router's /v1/fleet has no request totals (a router from before issue 15)"
        return fleet.totals, ""


def request_failures(router: str, readings: RecordReadings) -> tuple[RequestFailures | None, str]:
    """The router's counters at PRECHECK and at the end, and the difference; None and why not."""
    start, end = readings.start, readings.end
    if start is None:
        return None, "request failures: the rollout stopped before PRECHECK read the router's totals"
    if start.totals is None or end is None or end.totals is None:
        why = start.totals_missing or (end.totals_missing if end is not None else "no reading at the end")
        return None, f"request failures: {why}"
    return RequestFailures(
        source=router, before=start.totals, after=end.totals, during=end.totals.minus(start.totals)
    ), ""


def successors(start: Reading, end: Reading, replaced: list[dict[str, str]]) -> dict[str, str]:
    """Each engine of PRECHECK's fleet -> the engine serving in its place at the end: itself where its
    group is still there (untouched, or switched in place), else the member in the same position of
    the group that replaced its group."""
    new_group = {r["old"]: r["new"] for r in replaced}
    found: dict[str, str] = {}
    for group, members in start.groups.items():
        heirs = end.groups.get(group) or end.groups.get(new_group.get(group, ""), [])
        for i, member in enumerate(members):
            if i < len(heirs):
                found[member] = heirs[i]
    return found


def memory_deltas(
    readings: RecordReadings, replaced: list[dict[str, str]]
) -> tuple[list[MemoryDelta], list[str]]:
    """Per engine of PRECHECK's fleet: its last figure before, its successor's first after (the same
    engine where it was switched in place); engines at the end that took no one's place are listed
    with no figure before. Engines without figures are named in the second list."""
    start, end = readings.start, readings.end
    if start is None or end is None:
        why = "the rollout stopped before PRECHECK read the fleet" if start is None else readings.end_missing
        return [], [f"memory: {why or 'no reading at the end'}"]
    heirs = successors(start, end, replaced)
    deltas: list[MemoryDelta] = []
    missing: dict[str, str] = {}
    for member in (m for members in start.groups.values() for m in members):
        heir = heirs.get(member)
        before, after = start.memory.get(member), end.memory.get(heir) if heir else None
        if before is None:
            missing[member] = f"before: {start.memory_missing.get(member, 'not read')}"
        if after is None:
            missing[heir or member] = (
                f"after: {end.memory_missing.get(heir, 'not read')}"
                if heir
                else "after: no engine took its place"
            )
        if before is not None or after is not None:
            deltas.append(_delta(member, heir, before, after))
    taken = set(heirs.values())
    for member in (m for members in end.groups.values() for m in members if m not in taken):
        after = end.memory.get(member)
        if after is not None:
            deltas.append(_delta(member, None, None, after))
        else:
            missing[member] = f"after: {end.memory_missing.get(member, 'not read')}"
    return deltas, [f"memory of {name}: {why}" for name, why in missing.items()]


def _delta(
    engine: str, heir: str | None, before: EngineMemory | None, after: EngineMemory | None
) -> MemoryDelta:
    sources = sorted({m.source for m in (before, after) if m is not None})
    delta = None
    if before is not None and after is not None and before.source == after.source:
        delta = after.held_bytes - before.held_bytes  # figures from two sources do not subtract
    return MemoryDelta(
        engine=engine,
        replaced_by=heir if heir != engine else None,
        source="/".join(sources),
        before_bytes=before.held_bytes if before is not None else None,
        after_bytes=after.held_bytes if after is not None else None,
        delta_bytes=delta,
    )


def forced_exits(steps: list[Step]) -> tuple[list[ForcedExit] | None, list[str]]:
    """Every drained member's forced exits, unioned over the DRAIN steps' reports; None when one
    drain could not observe them (or its report never came back), with why."""
    found: list[ForcedExit] = []
    unobserved: list[str] = []  # a drain that could not say which requests it cut
    partial: list[str] = []  # a drain that listed some and counted the rest
    for step in steps:
        where = f"{step.step} {step.group or ''}".strip()
        if step.step == "SWITCH" or "change_record" in step.data:  # a host's switch (or switch back)
            # drained its engine itself: its forced exits are in the operation's own record
            switched = step.data.get("change_record")
            switched = switched if isinstance(switched, Mapping) else {}
            listed = switched.get("forced_exits")
            if not isinstance(listed, list):
                notes = [str(n) for n in switched.get("not_measured") or [] if "forced" in str(n)]
                why = "; ".join(n.removeprefix("forced_exits: ") for n in notes)
                unobserved.append(f"{where}: {why or 'the switch operation listed no forced exits'}")
                continue
            try:
                found.extend(ForcedExit.model_validate(e) for e in listed)
            except ValidationError as exc:
                unobserved.append(
                    f"{where}: its forced exits are not a list of them ({exc.error_count()} errors)"
                )
            continue
        if step.step != "DRAIN":
            continue
        reports = step.data.get("reports")
        if not isinstance(reports, Mapping):
            unobserved.append(f"{where}: no drain report came back ({step.detail or 'the step failed'})")
            continue
        for member, body in reports.items():
            try:
                report = DrainResult.model_validate(body)
            except ValidationError as exc:
                unobserved.append(
                    f"{where} {member}: its drain report is not one ({exc.error_count()} errors)"
                )
                continue
            if report.forced_exits is None:
                unobserved.append(f"{where} {member}: {report.forced_exits_unobserved or 'not observed'}")
                continue
            found.extend(report.forced_exits)
            if report.forced_exits_not_listed:
                partial.append(f"{where} {member}: {report.forced_exits_not_listed} more not listed")
    notes = [f"forced exits: {line}" for line in unobserved + partial]
    return (None if unobserved else found), notes


def latency(warmup_ttft_ms: dict[str, float], canary: list[WindowVerdict]) -> tuple[LatencyRecord, list[str]]:
    """Warmup TTFTs of the new engines; steady state, baseline and verdict from the last canary."""
    notes = (
        []
        if warmup_ttft_ms
        else ["latency: no warmup TTFT recorded (no new engine's first request was seen)"]
    )
    if not canary:
        notes.append("latency: no steady-state window (no canary ran: --canary-seconds 0, or none reached)")
        return LatencyRecord(warmup_ttft_ms=dict(warmup_ttft_ms)), notes
    last = canary[-1]
    record = LatencyRecord(
        warmup_ttft_ms=dict(warmup_ttft_ms), steady=last.window, baseline=last.baseline, verdict=last
    )
    return record, notes


class RolloutFacts(Protocol):
    """What the record reads of a rollout (`RolloutBase`), named here so this module need not import it."""

    kind: str
    id: str
    router: str
    target: BundleSpec
    settings: RolloutSettings
    steps: list[Step]
    from_bundles: dict[str, dict[str, Any]]
    replaced: list[dict[str, str]]
    fingerprints: dict[str, str]
    adapters: dict[str, str]
    canary: list[WindowVerdict]
    warmup_ttft_ms: dict[str, float]
    readings: RecordReadings
    rollback_command: str
    undoes: str | None


def rollback_point(rollout: RolloutFacts) -> tuple[RollbackPoint | None, str]:
    if not rollout.from_bundles:
        return None, "rollback point: the rollout stopped before PRECHECK read the fleet's bundles"
    command = rollout.rollback_command or "corral rollback --from-record <this record>"
    return RollbackPoint(bundles=dict(rollout.from_bundles), command=command, undoes=rollout.undoes), ""


def _settings(settings: RolloutSettings) -> dict[str, Any]:
    canary = settings.canary
    return {
        "max_surge": settings.max_surge,
        "max_unavailable": settings.max_unavailable,
        "canary": {"seconds": canary.seconds, **canary.thresholds.to_wire()} if canary.seconds else None,
    }


def graph_nccl_changes(
    target: BundleSpec, from_bundles: Mapping[str, Mapping[str, Any] | None]
) -> dict[str, list[dict[str, str]]]:
    """Per group, the graph/NCCL settings `target` changes from the bundle the group ran (groups started
    with their own command, whose bundle no record knows, are left out; so are groups with no change)."""
    here = bundle_settings(bundle_record(target))
    changes: dict[str, list[dict[str, str]]] = {}
    for group, before in from_bundles.items():
        if before:
            changed = changed_settings(here, bundle_settings(before))
            if changed:
                changes[group] = [c.to_json() for c in changed]
    return changes


def rollout_record(rollout: RolloutFacts, outcome: str, reason: str, started: float) -> RolloutRecord:
    """Every section of the record, from the rollout's steps, evidence and readings."""
    failures, failures_missing = request_failures(rollout.router, rollout.readings)
    memory, memory_missing = memory_deltas(rollout.readings, rollout.replaced)
    exits, exits_notes = forced_exits(rollout.steps)
    timing, latency_notes = latency(rollout.warmup_ttft_ms, rollout.canary)
    point, point_missing = rollback_point(rollout)
    not_measured = [failures_missing, *memory_missing, *exits_notes, *latency_notes, point_missing]
    return RolloutRecord(
        kind=rollout.kind,
        id=rollout.id,
        corral_version=__version__,
        started=started,
        finished=time.time(),
        outcome=outcome,
        reason=reason,
        router=rollout.router,
        from_bundles=dict(rollout.from_bundles),
        to_bundle=bundle_record(rollout.target),
        steps=[StepRecord.model_validate(s.to_json()) for s in rollout.steps],
        request_failures=failures,
        memory=memory,
        latency=timing,
        rollback_point=point,
        forced_exits=exits,
        not_measured=[line for line in not_measured if line],
        settings=_settings(rollout.settings),
        replaced=list(rollout.replaced),
        fingerprints=dict(rollout.fingerprints),
        # what every new group loaded before ROUTED; `served` is what `corral verify` keeps
        adapters={"carried": dict(rollout.adapters), "served": sorted(rollout.adapters)},
        canary=list(rollout.canary),
        graph_nccl_changes=graph_nccl_changes(rollout.target, rollout.from_bundles),
    )
