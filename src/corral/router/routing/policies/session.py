"""Session affinity: consistent hashing of a session header over the eligible endpoints, with
bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018).

A session's request goes to the first endpoint clockwise from the session's point on a ring of
virtual nodes that is under the load bound ceil((1 + eps) * mean in-flight), counting this
request. So a session stays on one endpoint while that endpoint stays eligible and under the
bound, and losing or gaining one endpoint moves only the sessions that hashed near it. Requests
without the header go to the fallback policy.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from hashlib import blake2b

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.policies import Policy, RouteRequest

VIRTUAL_NODES = 64
RING_CACHE_SIZE = 32


def stable_hash(key: str) -> int:
    """A hash that is the same in every process (Python's str hash is salted per process)."""
    return int.from_bytes(blake2b(key.encode(), digest_size=8).digest(), "big")


class Ring:
    """Virtual nodes of a fixed endpoint set, sorted by hash."""

    __slots__ = ("endpoints", "hashes", "owners")

    def __init__(self, endpoints: Sequence[Endpoint], virtual_nodes: int = VIRTUAL_NODES) -> None:
        points = sorted(
            (stable_hash(f"{e.url}#{v}"), i) for i, e in enumerate(endpoints) for v in range(virtual_nodes)
        )
        self.endpoints = tuple(endpoints)
        self.hashes = [h for h, _ in points]
        self.owners = [i for _, i in points]

    def walk(self, key_hash: int) -> Iterator[Endpoint]:
        """Endpoints in ring order clockwise from `key_hash`, each once."""
        n = len(self.endpoints)
        size = len(self.hashes)
        start = bisect.bisect_left(self.hashes, key_hash)
        seen = [False] * n
        found = 0
        for k in range(size):
            owner = self.owners[(start + k) % size]
            if not seen[owner]:
                seen[owner] = True
                yield self.endpoints[owner]
                found += 1
                if found == n:
                    return


def load_bound(candidates: Sequence[Endpoint], eps: float) -> int:
    """The most requests in flight any endpoint may hold after this one is placed."""
    total = sum(e.in_flight for e in candidates) + 1
    return math.ceil((1.0 + eps) * total / len(candidates))


class SessionAffinity:
    name = "session"

    def __init__(self, header: str, fallback: Policy, eps: float = 0.25) -> None:
        self.header = header
        self.eps = eps
        self._fallback = fallback
        self._rings: dict[tuple[str, ...], Ring] = {}

    def ring(self, candidates: Sequence[Endpoint]) -> Ring:
        key = tuple(e.url for e in candidates)
        ring = self._rings.get(key)
        if ring is None or ring.endpoints != tuple(candidates):
            if len(self._rings) >= RING_CACHE_SIZE:
                self._rings.clear()
            ring = self._rings[key] = Ring(candidates)
        return ring

    def pick(self, candidates: Sequence[Endpoint], request: RouteRequest) -> Endpoint:
        session = request.headers.get(self.header)
        if not session:
            return self._fallback.pick(candidates, request)
        if len(candidates) == 1:
            return candidates[0]
        ring = self.ring(candidates)
        bound = load_bound(candidates, self.eps)
        for endpoint in ring.walk(stable_hash(session)):
            if endpoint.in_flight < bound:
                return endpoint
        # Unreachable: the bound is at least the mean after placement, so some endpoint is under it.
        return min(candidates, key=lambda e: e.in_flight)
