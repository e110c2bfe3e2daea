"""The one question prefix-aware placement asks about the engines' caches: how much of a request's
prompt prefix each endpoint likely holds, and the pick it learns from. The router's own memory of its
picks (`prefix_memory.PrefixMemory`) and the index of the engines' KV-cache events both answer it, so
the placement rule is the same with and without events."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.request import RouteRequest


class PrefixHolders(Protocol):
    def held(self, request: RouteRequest, pool: Sequence[Endpoint]) -> list[float]:
        """Per endpoint of `pool`, in order, the share in [0, 1] of the request's prompt prefix it
        likely holds (0 for a prompt with nothing worth caching)."""
        ...

    def sent(self, request: RouteRequest, endpoint: Endpoint) -> None:
        """The pick is made: `endpoint` will cache the prompt's prefix."""
        ...

    def placed(self, endpoint: Endpoint) -> int:
        """How many prompt prefixes this router has placed on `endpoint` and still counts there (its
        share of the router's placements, for spreading new ones: `scorers.FootprintScorer`)."""
        ...

    def holders(self, request: RouteRequest) -> Iterable[str]:
        """The urls of the endpoints that likely hold some of the request's prefix, the deepest holders
        first, each once, without a pool: what a pick on a large fleet scores besides a sample
        (`filters.candidates_for`, which reads only the first few)."""
        ...
