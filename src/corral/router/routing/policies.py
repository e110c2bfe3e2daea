"""The unscored policies: round robin, least request (power of two choices), and session affinity
(consistent hashing of a session header with bounded loads, Mirrokni, Thorup, Zadimoghaddam 2018).

A session's request goes to the first endpoint clockwise from the session's point on the ring that is
under the load bound ceil((1 + eps) * mean in-flight), counting this request. So a session stays on
one endpoint while that endpoint stays eligible and under the bound, and losing or gaining one
endpoint moves only the sessions that hashed near it. Requests without the header go to the fallback.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.filters import load_bound
from corral.router.routing.request import Policy, RouteRequest
from corral.router.routing.rings import RingCache, stable_hash


class RoundRobin:
    """Each request goes to the next candidate in turn."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def pick(self, candidates: Sequence[Endpoint], request: RouteRequest) -> Endpoint:
        i = self._next
        self._next = i + 1
        return candidates[i % len(candidates)]


class LeastRequest:
    """Sample two candidates, take the one with fewer requests in flight from this router. Close to
    the true minimum, and it spreads ties instead of herding every router onto the same idle one."""

    name = "least_request"

    def __init__(self, seed: int | None = None) -> None:
        self._random = random.Random(seed)

    def pick(self, candidates: Sequence[Endpoint], request: RouteRequest) -> Endpoint:
        n = len(candidates)
        if n == 1:
            return candidates[0]
        rand = self._random.randrange
        i = rand(n)
        j = rand(n - 1)
        if j >= i:
            j += 1
        a = candidates[i]
        b = candidates[j]
        return b if b.host_in_flight < a.host_in_flight else a


class SessionAffinity:
    name = "session"

    def __init__(self, header: str, fallback: Policy, eps: float = 0.25) -> None:
        self.header = header
        self.eps = eps
        self._fallback = fallback
        self._rings = RingCache()

    def pick(self, candidates: Sequence[Endpoint], request: RouteRequest) -> Endpoint:
        session = request.headers.get(self.header)
        if not session:
            return self._fallback.pick(candidates, request)
        if len(candidates) == 1:
            return candidates[0]
        ring = self._rings.ring(candidates)
        bound = load_bound(candidates, self.eps)
        for endpoint in ring.walk(stable_hash(session)):
            if endpoint.host_in_flight < bound:
                return endpoint
        # Unreachable: the bound is at least the mean after placement, so some endpoint is under it.
        return min(candidates, key=lambda e: e.host_in_flight)
