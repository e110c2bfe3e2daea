"""Filters: which of the eligible endpoints a scored pick may choose at all.

Eligibility itself (READY, serves the model or adapter, not ejected) is membership's answer; the one
filter here is the load bound of consistent hashing with bounded loads (Mirrokni, Thorup,
Zadimoghaddam 2018): no endpoint may hold more than ceil((1 + eps) * mean) of this router's requests in
flight, counting the one being placed. The least loaded endpoint is always under the bound, so the
filter never empties the set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from corral.router.membership.endpoint import Endpoint


def load_bound(candidates: Sequence[Endpoint], eps: float) -> int:
    total = sum(e.in_flight for e in candidates) + 1
    return math.ceil((1.0 + eps) * total / len(candidates))


def within_load_bound(candidates: Sequence[Endpoint], eps: float) -> list[Endpoint]:
    """The candidates that may take one more request and stay within the bound."""
    bound = load_bound(candidates, eps)
    return [e for e in candidates if e.in_flight < bound]
