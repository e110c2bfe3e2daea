"""In flight: fewer of this router's own requests open at the engine is better. Always current (no
scrape), but blind to other router replicas' traffic; the queue scorer sees that, a scrape late."""

from __future__ import annotations

from collections.abc import Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.scorers import PickContext


class InFlightScorer:
    name = "in_flight"

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        worst = max(e.in_flight for e in pool) + 1
        return [1.0 - e.in_flight / worst for e in pool]
