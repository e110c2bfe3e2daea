"""Least request by the power of two choices: sample two candidates, take the one with fewer
requests in flight from this router. Close to the true minimum, and it spreads ties instead of
herding every router onto the same idle endpoint."""

from __future__ import annotations

import random
from collections.abc import Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.policies import RouteRequest


class LeastRequest:
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
        return b if b.in_flight < a.in_flight else a
