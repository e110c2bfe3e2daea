"""Round robin: each request goes to the next candidate in turn."""

from __future__ import annotations

from collections.abc import Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.policies import RouteRequest


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def pick(self, candidates: Sequence[Endpoint], request: RouteRequest) -> Endpoint:
        i = self._next
        self._next = i + 1
        return candidates[i % len(candidates)]
