"""The rollout of a local prefill/decode fleet (`corral up --prefill N --decode M`): its serving groups
move in the waves fleet/rollout/pd_plan.py orders, planned again before each wave (once a new group has
reported the target's pairing identity, a bundle that keeps it lets each role move on its own).

For each wave, with surge: START, VERIFY, ROUTED (and CANARY) for every new group of the wave; PAIRS,
which reads the router's /v1/fleet and requires that without the wave's old engines a complete
compatible pair and --min-prefill/--min-decode usable engines stay routable (else the new groups are
taken out again and the old ones keep serving); DRAIN, RETIRE, GONE for every old group of the wave
(each drain waits for the transfers its engine holds); PAIRS again, recording what the router routes.
Without surge the same PAIRS check comes first, then the old groups go, PAIRS at the lowest point, and
the new ones come up (RECOVER on a failure). A wave's old prefill groups go before its old decode
groups, so the transfers a draining prefill engine holds are pulled by decode engines still routed.
PRECHECK refuses a plan that cannot keep the minimums. A fleet without roles rolls out as LocalRollout
does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any

from corral.clients.access import RouterAdminError
from corral.clients.router import RouterAdminClient
from corral.fleet.rollout.groups import LocalRollout
from corral.fleet.rollout.pd_plan import (
    BOTH,
    DECODE,
    PREFILL,
    Capacity,
    PairLimits,
    PlanGroup,
    PlanRefused,
    Wave,
    has_roles,
    plan_waves,
)
from corral.fleet.rollout.steps import Group, Step, StepFailed


async def _all(moves: Iterable[Awaitable[Any]]) -> list[Any]:
    """Every move to its end (or its own RECOVER) before the first failure goes on up."""
    done = await asyncio.gather(*moves, return_exceptions=True)
    for outcome in done:
        if isinstance(outcome, BaseException):
            raise outcome
    return done


class PairedRollout(LocalRollout):
    """A `corral up` fleet's rollout that keeps prefill/decode pairs (LocalRollout's when no group has
    a role)."""

    @property
    def limits(self) -> PairLimits:
        return PairLimits(self.settings.min_prefill, self.settings.min_decode)

    async def _precheck(self, step: Step) -> list[Group]:
        todo = await super()._precheck(step)
        groups = await self._groups()
        if has_roles(g.role for g in groups):
            waves = self._plan(groups, {g.name for g in todo})
            step.data["plan"] = [
                {"groups": list(w.groups), "together": w.together, "lowest": w.lowest.to_json()}
                for w in waves
            ]
            step.detail += "; P/D waves: " + " then ".join("+".join(w.groups) for w in waves)
        return todo

    def _plan(self, groups: list[Group], moving: set[str]) -> list[Wave]:
        """The waves that move `moving`, from the fleet's groups and their pairing identities now."""
        per_wave = self.settings.max_surge or self.settings.max_unavailable
        return plan_groups(
            groups, self.pairings, moving, per_wave, bool(self.settings.max_surge), self.limits
        )

    async def _move_all(self, todo: list[Group]) -> None:
        remaining = {g.name: g for g in todo}
        groups = await self._groups()
        if not has_roles(g.role for g in groups):
            await super()._move_all(todo)
            return
        n = 0
        while remaining:
            if n:  # the groups this rollout started are in it now, their identity measured at VERIFY
                groups = await self._groups()
            wave = self._plan(groups, set(remaining))[0]
            n += 1
            await self._move_wave(f"wave {n}", [remaining.pop(name) for name in wave.groups])

    async def _move_wave(self, label: str, olds: list[Group]) -> None:
        leaving = {e for g in olds for e in g.engines}
        if self.settings.max_surge:
            news = await self._bring_up_all(olds)
            try:
                await self._step("PAIRS", label, lambda s: self._pairs(s, leaving, "without the old groups"))
            except StepFailed:
                await _all(self._take_out(n) for n in news)
                raise
            await self._take_down_all(olds)
        else:
            await self._step("PAIRS", label, lambda s: self._pairs(s, leaving, "without the old groups"))
            await self._take_down_all(olds)
            await self._step("PAIRS", label, lambda s: self._pairs(s, set(), "at the lowest point"))
            news = await _all(self._replace(old) for old in olds)
        await self._step("PAIRS", label, lambda s: self._pairs(s, set(), "after the wave"))
        for old, new in zip(olds, news, strict=True):
            self.replaced.append(
                {"old": old.name, "new": new.name, "fingerprint": self.fingerprints[new.name]}
            )

    async def _take_down_all(self, olds: list[Group]) -> None:
        """The old prefill groups first, then the decode ones: a prefill engine's drain waits until
        its held transfers are pulled, which needs the decode engines that pull them still routed."""
        for roles in ((PREFILL,), (BOTH,), (DECODE,)):
            await _all(self._take_down(old) for old in olds if old.role in roles)

    async def _bring_up_all(self, olds: list[Group]) -> list[Group]:
        """A new group for each old one, all routed (and through their canaries); if one fails, those
        that came up are taken out again and the failure goes on up."""
        started = await asyncio.gather(
            *(self._bring_up(old, self.target, len(old.members)) for old in olds), return_exceptions=True
        )
        news = [g for g in started if isinstance(g, Group)]
        failed = next((e for e in started if isinstance(e, BaseException)), None)
        if failed is None:
            try:
                await _all(self._watch_canary(new) for new in news)
                return news
            except StepFailed as exc:
                failed = exc
        # a new prefill group is no use without its new decode group: none stays behind
        taken = {s.group for s in self.steps if s.step == "RECOVER"}
        await asyncio.gather(
            *(self._take_out(n) for n in news if n.name not in taken), return_exceptions=True
        )
        raise failed

    async def _take_out(self, new: Group) -> None:
        """RECOVER: a new group of a wave that cannot go on, out of the fleet again."""
        await self._step("RECOVER", new.name, lambda s: self._withdraw(s, new))

    async def _replace(self, old: Group) -> Group:
        """Without surge: the new group in the old one's place, or the old bundle again (RECOVER)."""
        try:
            new = await self._bring_up(old, self.target, len(old.members))
            await self._watch_canary(new)
            return new
        except StepFailed:
            if old.bundle is not None:
                await self._step("RECOVER", old.name, lambda s: self._recover(s, old, len(old.members)))
            raise

    async def _pairs(self, step: Step, leaving: set[str], when: str) -> None:
        await check_pairs(self._router_admin, self.limits, step, leaving, when)


def plan_groups(
    groups: list[Group],
    pairings: dict[str, str | None],
    moving: set[str],
    per_wave: int,
    surge: bool,
    limits: PairLimits,
    in_place: bool = False,
) -> list[Wave]:
    """The waves that move `moving` (pd_plan.plan_waves), from the fleet's groups and the pairing
    identities they published; the target's identity is that of any group already moved (None before
    one has). StepFailed with the planner's refusal."""
    planned = [
        PlanGroup(g.name, g.role, len(g.members), pairings.get(g.name), g.name in moving) for g in groups
    ]
    on_target = [pairings.get(g.name) for g in groups if g.name not in moving]
    target = next((p for p in on_target if p is not None), None)
    try:
        return plan_waves(planned, target, per_wave, surge, limits, in_place)
    except PlanRefused as exc:
        raise StepFailed(str(exc)) from None


async def check_pairs(
    admin: RouterAdminClient, limits: PairLimits, step: Step, leaving: set[str], when: str
) -> None:
    """PAIRS: from the router's /v1/fleet, what its routable endpoints, less `leaving` (engine or
    supervisor URLs), can serve as prefill/decode pairs; StepFailed when that breaks the minimums."""
    try:
        fleet = await admin.fleet()
    except RouterAdminError as exc:
        raise StepFailed(str(exc)) from None
    kept = [
        e for e in fleet.endpoints if e.routable and e.url not in leaving and e.supervisor_url not in leaving
    ]
    capacity = Capacity.of((e.role, e.pairing, 1) for e in kept)
    router_pairs = [p.to_wire() for p in fleet.pairs]
    step.data = {
        "when": when,
        "leaving": sorted(leaving),
        **capacity.to_json(),
        "routable": {e.url: {"role": e.role, "pairing": e.pairing} for e in kept},
        "router_pairs": router_pairs,
    }
    why = capacity.shortfall(limits)
    said = "; ".join(f"{p.model}: {p.pairs} pairs ({p.why})" for p in fleet.pairs) or "no pairs listed"
    if why is not None:
        raise StepFailed(f"{when}: {why}; the router says {said}")
    if not leaving and not any(p.pairs for p in fleet.pairs):
        raise StepFailed(f"{when}: the router lists no routable compatible pair ({said})")
    step.detail = (
        f"{when}: {capacity.prefill} prefill and {capacity.decode} decode usable in "
        f"{len(capacity.pairs)} pairing identity(ies); router: {said}"
    )
