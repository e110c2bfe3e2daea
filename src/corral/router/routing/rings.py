"""Consistent-hash rings over candidate sets, built once per distinct set and kept (a fleet has few)."""

from __future__ import annotations

from collections.abc import Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.policies.session import Ring

RING_CACHE_SIZE = 32


class RingCache:
    __slots__ = ("_rings",)

    def __init__(self) -> None:
        self._rings: dict[tuple[str, ...], Ring] = {}

    def ring(self, candidates: Sequence[Endpoint]) -> Ring:
        key = tuple(e.url for e in candidates)
        ring = self._rings.get(key)
        if ring is None or ring.endpoints != tuple(candidates):
            if len(self._rings) >= RING_CACHE_SIZE:
                self._rings.clear()
            ring = self._rings[key] = Ring(candidates)
        return ring
