"""Session: the endpoint that a session header's value hashes to on the ring scores 1, the others 0;
requests without the header are not scored."""

from __future__ import annotations

from collections.abc import Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.policies.session import stable_hash
from corral.router.routing.rings import RingCache
from corral.router.routing.scorers import PickContext


class SessionScorer:
    name = "session"

    def __init__(self, header: str = "x-session-id") -> None:
        self.header = header
        self._rings = RingCache()

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        session = ctx.request.headers.get(self.header)
        if not session:
            return [0.0] * len(pool)
        allowed = {id(e) for e in pool}
        for e in self._rings.ring(ctx.eligible).walk(stable_hash(session)):
            if id(e) in allowed:
                return [1.0 if x is e else 0.0 for x in pool]
        return [0.0] * len(pool)
