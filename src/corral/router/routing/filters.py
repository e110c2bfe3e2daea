"""Filters: which of the eligible endpoints a scored pick may choose at all, and how many of them it
looks at.

Eligibility itself (READY, serves the model or adapter, not ejected) is membership's answer; the load
bound is consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018): no endpoint may
hold more than ceil((1 + eps) * mean) of this router's requests in flight, counting the one being
placed. The least loaded endpoint is always under the bound, so the filter never empties the set. On a
membership `EligibleSet` the total in flight is kept as requests start and end, so the bound is O(1).

`candidates_for` bounds a scored pick's work on a large fleet: the endpoints the prompt favours (those
that hold its prefix, its ring home: `favored`) and a few sampled at random (power of k choices,
Mitzenmacher 2001), instead of scoring every eligible endpoint; the policy then applies the bound of
the whole set to them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import islice

from corral.router.membership.eligible import EligibleSet
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.scorers import PickContext, PrefixScorer

# Random candidates a scored pick samples besides the ones the prompt favours: two choices already turn
# the maximum load's growth from log n / log log n into log log n (Mitzenmacher 2001), and with the
# holders and the ring home a pick on 1,000 engines scores about what it scores on 4 (bench_scale).
SAMPLED = 2
# Up to this many eligible endpoints, a scored pick scores them all (the sample would be most of them).
SCORE_ALL_UP_TO = 8
# Of a hot prefix's holders, a pick on a large fleet scores at most this many, those within the load
# bound first: a prefix gains holders as its traffic grows (and on a larger fleet, where the bound is
# tighter, it gains more), and scoring every one of them made the pick grow with the fleet.
HOLDERS_SCORED = 2


def in_flight_total(candidates: Sequence[Endpoint]) -> int:
    if isinstance(candidates, EligibleSet):
        return candidates.in_flight
    return sum(e.host_in_flight for e in candidates)


def load_bound(candidates: Sequence[Endpoint], eps: float) -> int:
    return math.ceil((1.0 + eps) * (in_flight_total(candidates) + 1) / len(candidates))


def candidates_for(
    candidates: Sequence[Endpoint],
    rng: random.Random,
    favored: Callable[[], Iterable[Endpoint]] | None = None,
    sampled: int = SAMPLED,
) -> Sequence[Endpoint]:
    """The endpoints a scored pick scores: all of them on a small fleet; on a large one, `favored()`
    (asked only then, kept in its order) and `sampled` drawn at random, each once."""
    n = len(candidates)
    if n <= SCORE_ALL_UP_TO:
        return candidates
    # a handful at most (`favored` names few), so a repeat is found by scanning the pool (an endpoint
    # compares by identity)
    pool: list[Endpoint] = []
    for e in favored() if favored is not None else ():
        if e not in pool:
            pool.append(e)
    draw = rng.random
    for _ in range(sampled):  # with replacement: a repeat is rare on a fleet this size, and skipped
        e = candidates[int(draw() * n)]
        if e not in pool:
            pool.append(e)
    return pool


def favored(
    prefix: PrefixScorer | None, ctx: PickContext, bound: int | None = None, limit: int = HOLDERS_SCORED
) -> list[Endpoint]:
    """What a prompt's pick must see on a large fleet besides a sample: the eligible endpoints its
    prefix holders name (`PrefixHolders.holders`), at most `limit` of them, those under `bound` in
    flight first, in the holders' order; or, for a prefix no endpoint holds, its ring home (which every
    replica names alike, so an idle fleet's replicas agree on where a new prefix goes)."""
    if prefix is None:
        return []
    if prefix.holders is not None:
        held = first_holders(prefix.holders.holders(ctx.request), members_by_url(ctx.eligible), bound, limit)
        if held:
            return held
    key = prefix.key(ctx)
    return [] if key is None else list(islice(prefix.rings.ring(ctx.eligible).walk(key), 1))


def first_holders(
    urls: Iterable[str], members: Mapping[str, Endpoint], bound: int | None, limit: int
) -> list[Endpoint]:
    """The first `limit` eligible endpoints of `urls` under `bound` in flight, then, if fewer, the
    first of those over it (the policy keeps an engine over the bound that reports room)."""
    under: list[Endpoint] = []
    over: list[Endpoint] = []
    for url in urls:
        e = members.get(url)
        if e is None:
            continue
        if bound is None or e.host_in_flight < bound:
            under.append(e)
            if len(under) == limit:
                return under
        elif len(over) < limit:
            over.append(e)
    return under + over[: limit - len(under)]


def members_by_url(candidates: Sequence[Endpoint]) -> Mapping[str, Endpoint]:
    if isinstance(candidates, EligibleSet):
        return candidates.by_url
    return {e.url: e for e in candidates}
