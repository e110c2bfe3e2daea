"""The eligible sets membership hands the data path: per model (and P/D role), the endpoints that may take
a request now, built once per change instead of once per request, carrying what the policies would
otherwise recount on every pick (this router's requests in flight to the set, the newest member's ramp
start).

A set stays valid until membership changes (`EligibleSets.clear`, on every change that can alter any
set: an endpoint added or removed, a state, model, role, pairing or group verdict changed, an ejection)
or until the soonest ejection among the endpoints it left out ends (`EligibleSet.valid_until`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint


class EligibleSet(list[Endpoint]):
    """The endpoints, in membership's order. Shared by every request until the next change: callers
    read it and never change it (a filtered view is a new list)."""

    __slots__ = ("_by_url", "in_flight", "key", "newest_start", "valid_until")

    def __init__(self, key: tuple[str, str | None], members: Iterable[Endpoint], valid_until: float) -> None:
        super().__init__(members)
        self.key = key
        self.valid_until = valid_until
        # The sum of the members' `host_in_flight` (this host's workers' requests), kept by
        # `Endpoint.in_flight`'s setter and `sibling_in_flight` while attached.
        self.in_flight = sum(e.host_in_flight for e in self)
        self.newest_start = max((e.routable_from for e in self), default=-math.inf)
        self._by_url: dict[str, Endpoint] | None = None

    @property
    def by_url(self) -> dict[str, Endpoint]:
        """The members by url (built on first use, once per set)."""
        if self._by_url is None:
            self._by_url = {e.url: e for e in self}
        return self._by_url

    def attach(self) -> None:
        for e in self:
            e.tallies = (*e.tallies, self)

    def detach(self) -> None:
        for e in self:
            e.tallies = tuple(t for t in e.tallies if t is not self)


def build_eligible(
    key: tuple[str, str | None], serving: Iterable[Endpoint], role: str | None, now: float
) -> EligibleSet:
    """READY, not ejected (and, for a role, of that role or `both`), valid until the soonest ejection
    among the READY ones left out ends."""
    ready = EngineState.READY
    members: list[Endpoint] = []
    valid_until = math.inf
    for e in serving:
        if e.state is not ready or (role is not None and e.role != role and e.role != "both"):
            continue
        if e.ejected_until > now:
            valid_until = min(valid_until, e.ejected_until)
            continue
        members.append(e)
    return EligibleSet(key, members, valid_until)


class EligibleSets:
    """The sets built since the last change, by (model, role)."""

    __slots__ = ("_sets", "builds")

    def __init__(self) -> None:
        self._sets: dict[tuple[str, str | None], EligibleSet] = {}
        self.builds = 0

    def get(self, model: str, role: str | None, serving: Iterable[Endpoint], now: float) -> EligibleSet:
        key = (model, role)
        found = self._sets.get(key)
        if found is not None:
            if now < found.valid_until:
                return found
            found.detach()
        built = self._sets[key] = build_eligible(key, serving, role, now)
        built.attach()
        self.builds += 1
        return built

    def clear(self) -> None:
        for found in self._sets.values():
            found.detach()
        self._sets.clear()
