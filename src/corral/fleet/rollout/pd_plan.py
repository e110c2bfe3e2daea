"""The order in which a rollout moves the serving groups of a prefill/decode fleet: waves of groups that
keep, at every step, `--min-prefill` and `--min-decode` usable engines and at least one complete
compatible pair, or a refusal saying which step could not and what to change.

An engine is usable when some routable engine of the other role shares its pairing identity
(engine/pd_protocol.py): a decode engine whose prefill partners are all gone serves nothing. When the
target bundle's identity differs from (or is not yet known to equal) a moving group's, a new prefill
engine only pairs with a new decode engine, so each wave moves prefill and decode groups together;
when it is the same, each wave moves groups of one role, alternating.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PREFILL, DECODE, BOTH = "prefill", "decode", "both"
_ROLES = (PREFILL, DECODE, BOTH)
TARGET_UNKNOWN = "<target: not yet measured>"  # the target's identity before any new group reported it


class PlanRefused(Exception):
    """No order of moves keeps the minimums with these settings; the message says why and what to do."""


@dataclass(frozen=True)
class PlanGroup:
    """A serving group as the planner sees it: its role, its engines, its pairing identity (None: not
    known, so it pairs with nothing) and whether it still has to move."""

    name: str
    role: str
    engines: int
    pairing: str | None
    moves: bool = True

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise ValueError(
                f"group {self.name} has role {self.role!r}; a role is one of {', '.join(_ROLES)}"
            )


@dataclass(frozen=True)
class PairLimits:
    min_prefill: int = 1
    min_decode: int = 1

    def __post_init__(self) -> None:
        if self.min_prefill < 0 or self.min_decode < 0:
            raise ValueError("--min-prefill and --min-decode are engine counts, 0 or more")


@dataclass(frozen=True)
class Capacity:
    """What a set of routable engines can serve: usable engines per role and the complete pairs (the
    pairing identities with at least one prefill-capable and one decode-capable engine)."""

    prefill: int
    decode: int
    pairs: tuple[str, ...]

    @classmethod
    def of(cls, engines: Iterable[tuple[str, str | None, int]]) -> Capacity:
        """From (role, pairing identity, engine count) of each routable group or endpoint; an unknown
        identity pairs with nothing but a `both` engine pairs with itself."""
        prefill: dict[str, int] = {}
        decode: dict[str, int] = {}
        for n, (role, pairing, count) in enumerate(engines):
            key = pairing if pairing is not None else f"<unknown {n}>"
            if role in (PREFILL, BOTH):
                prefill[key] = prefill.get(key, 0) + count
            if role in (DECODE, BOTH):
                decode[key] = decode.get(key, 0) + count
        pairs = tuple(sorted(k for k in prefill if prefill[k] and decode.get(k)))
        return cls(sum(prefill[k] for k in pairs), sum(decode[k] for k in pairs), pairs)

    def shortfall(self, limits: PairLimits) -> str | None:
        """Why this capacity breaks the limits (None: it keeps them)."""
        if not self.pairs:
            return "no complete compatible pair routable"
        short = [
            f"{have} usable {role} engine(s), below --min-{role} {need}"
            for role, have, need in (
                (PREFILL, self.prefill, limits.min_prefill),
                (DECODE, self.decode, limits.min_decode),
            )
            if have < need
        ]
        return "; ".join(short) or None

    def to_json(self) -> dict[str, object]:
        return {"usable_prefill": self.prefill, "usable_decode": self.decode, "pairs": list(self.pairs)}


@dataclass(frozen=True)
class Wave:
    """Groups moved together, and the fleet at the wave's lowest point (surge: once its old groups are
    gone; without: once they are down and before their replacements are up)."""

    groups: tuple[str, ...]
    together: bool  # prefill and decode moved as one unit: the new pair is up before the old drains
    lowest: Capacity


def has_roles(roles: Iterable[str]) -> bool:
    """Whether a fleet with these group roles is disaggregated (any prefill or decode group)."""
    return any(role in (PREFILL, DECODE) for role in roles)


def plan_waves(
    groups: Sequence[PlanGroup],
    target_pairing: str | None,
    per_wave: int,
    surge: bool,
    limits: PairLimits,
    in_place: bool = False,
) -> list[Wave]:
    """The waves that move every group with `moves` to the target, each checked against `limits`
    at its lowest point; PlanRefused names the first that breaks them. `target_pairing` None: the
    target's identity is not known yet, so it is taken to differ from every group's (the safe case).
    `per_wave`: groups of each role moved at once (--max-surge, or --max-unavailable). `in_place`:
    the groups are hosts switched where they run (no surge possible), which the refusal's advice says."""
    if per_wave < 1:
        raise ValueError("per_wave must be at least 1")
    target = target_pairing if target_pairing is not None else TARGET_UNKNOWN
    moving = [g for g in groups if g.moves]
    by_role = {role: [g for g in moving if g.role == role] for role in _ROLES}
    together = any(g.pairing != target for g in moving)
    batches: list[list[PlanGroup]] = []
    if together:
        prefill, decode = by_role[PREFILL], by_role[DECODE]
        for i in range(0, max(len(prefill), len(decode)), per_wave):
            batches.append(prefill[i : i + per_wave] + decode[i : i + per_wave])
    else:
        queues = [by_role[PREFILL], by_role[DECODE]]
        while any(queues):
            for queue in queues:
                if queue:
                    batches.append(queue[:per_wave])
                    del queue[:per_wave]
    both = by_role[BOTH]
    batches += [both[i : i + per_wave] for i in range(0, len(both), per_wave)]

    fleet = {g.name: (g.role, g.pairing, g.engines) for g in groups}
    start = Capacity.of(fleet.values())
    if (why := start.shortfall(limits)) is not None:
        raise PlanRefused(f"the fleet starts short: {why}; fix the fleet first (`corral doctor`)")
    waves: list[Wave] = []
    for n, batch in enumerate(batches, 1):
        names = tuple(g.name for g in batch)
        if surge:  # the new groups come up beside the old, then the old ones go
            for g in batch:
                fleet[g.name + "'"] = (g.role, target, g.engines)
                del fleet[g.name]
            lowest = Capacity.of(fleet.values())
        else:  # the old groups go first; the lowest point is before their replacements are up
            for g in batch:
                del fleet[g.name]
            lowest = Capacity.of(fleet.values())
            for g in batch:
                fleet[g.name + "'"] = (g.role, target, g.engines)
        if (why := lowest.shortfall(limits)) is not None:
            raise PlanRefused(_refusal(n, names, why, surge, together, in_place))
        roles = {g.role for g in batch}
        waves.append(Wave(names, together and PREFILL in roles and DECODE in roles, lowest))
    return waves


def _refusal(n: int, names: tuple[str, ...], why: str, surge: bool, together: bool, in_place: bool) -> str:
    moved = f"step {n} (moving {', '.join(names)})"
    if in_place:
        hint = (
            "hosts are switched in place with no spare to surge into: add hosts of each role, lower "
            "--max-unavailable or --min-prefill/--min-decode"
        )
    elif surge:
        hint = (
            "raise --max-surge so more new groups of each role are up before the old ones go, or lower "
            "--min-prefill/--min-decode"
        )
    else:
        hint = "use --max-surge (new groups up before old ones go) or a lower --max-unavailable"
    if together:
        hint += (
            "; the target's pairing identity differs from (or is not yet known to equal) the fleet's, so "
            "old engines only pair with old and new with new"
        )
    return f"{moved} would leave {why}: {hint}"
