"""Filters: which of the eligible endpoints a scored pick may choose at all, and how many of them it
looks at.

Eligibility itself (READY, serves the model or adapter, not ejected) is membership's answer; the load
bound is consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018): no endpoint may
hold more than ceil((1 + eps) * mean) of this router's requests in flight, counting the one being
placed. The least loaded endpoint is always under the bound, so the filter never empties the set. On a
membership `EligibleSet` the total in flight is kept as requests start and end, so the bound is O(1).

`candidates_for` bounds a scored pick's work on a large fleet: the endpoints the policy favours (a
prompt's prefix holders and ring homes) and a few sampled at random (power of k choices, Mitzenmacher
2001), all within the bound, instead of scoring every eligible endpoint.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

from corral.router.membership.eligible import EligibleSet
from corral.router.membership.endpoint import Endpoint

# Random candidates a scored pick samples besides the ones its policy favours. With 8 of n, the one
# the load scorers choose is in the least loaded ninth of the fleet on average.
SAMPLED = 8
# Up to this many eligible endpoints, a scored pick scores them all (the sample would be most of them).
SCORE_ALL_UP_TO = 32


def in_flight_total(candidates: Sequence[Endpoint]) -> int:
    if isinstance(candidates, EligibleSet):
        return candidates.in_flight
    return sum(e.in_flight for e in candidates)


def load_bound(candidates: Sequence[Endpoint], eps: float) -> int:
    return math.ceil((1.0 + eps) * (in_flight_total(candidates) + 1) / len(candidates))


def within_load_bound(candidates: Sequence[Endpoint], eps: float) -> list[Endpoint]:
    """The candidates that may take one more request and stay within the bound."""
    bound = load_bound(candidates, eps)
    return [e for e in candidates if e.in_flight < bound]


def candidates_for(
    candidates: Sequence[Endpoint],
    eps: float,
    rng: random.Random,
    favored: Iterable[Endpoint] = (),
    sampled: int = SAMPLED,
) -> list[Endpoint]:
    """The endpoints a scored pick scores: all those within the bound on a small fleet; on a large one,
    `favored` (in its order) and `sampled` random others, within the bound, each once. Never empty:
    when every one drawn is over the bound, the least loaded of the draw is kept."""
    n = len(candidates)
    if n <= SCORE_ALL_UP_TO:
        return within_load_bound(candidates, eps)
    bound = load_bound(candidates, eps)
    pool: list[Endpoint] = []
    seen: set[int] = set()
    for e in favored:
        if e.in_flight < bound and id(e) not in seen:
            seen.add(id(e))
            pool.append(e)
    drawn: list[Endpoint] = []
    draw = rng.random
    for _ in range(sampled):  # with replacement: a repeat is rare on a fleet this size, and skipped
        e = candidates[int(draw() * n)]
        drawn.append(e)
        if e.in_flight < bound and id(e) not in seen:
            seen.add(id(e))
            pool.append(e)
    if not pool:
        pool.append(min(drawn, key=lambda e: e.in_flight))
    return pool
