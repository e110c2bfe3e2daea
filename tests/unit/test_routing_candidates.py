"""The bounded candidate set of scored picks on large fleets (`filters.candidates_for`): the favoured
endpoints and a random sample, all within the load bound, never empty; small fleets score everyone."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.filters import (
    SAMPLED,
    SCORE_ALL_UP_TO,
    candidates_for,
    load_bound,
    within_load_bound,
)


def fleet(n: int, loads: list[int]) -> list[Endpoint]:
    out = []
    for i in range(n):
        e = Endpoint(f"http://10.0.{i // 256}.{i % 256}:8000", frozenset({"m"}), EngineState.READY)
        e.in_flight = loads[i % len(loads)]
        out.append(e)
    return out


@given(st.integers(2, SCORE_ALL_UP_TO), st.lists(st.integers(0, 20), min_size=1, max_size=8))
def test_a_small_fleet_scores_every_endpoint_within_the_bound(n: int, loads: list[int]) -> None:
    endpoints = fleet(n, loads)
    assert candidates_for(endpoints, 0.25, random.Random(0)) == within_load_bound(endpoints, 0.25)


@given(
    st.integers(SCORE_ALL_UP_TO + 1, 400),
    st.lists(st.integers(0, 20), min_size=1, max_size=8),
    st.integers(0, 2**32),
    st.lists(st.integers(0, 399), max_size=4),
)
def test_a_large_fleet_scores_the_favoured_and_a_sample(
    n: int, loads: list[int], seed: int, favoured_at: list[int]
) -> None:
    endpoints = fleet(n, loads)
    favoured = [endpoints[i % n] for i in favoured_at]
    pool = candidates_for(endpoints, 0.25, random.Random(seed), favoured)
    bound = load_bound(endpoints, 0.25)
    assert pool and len(pool) <= len(set(map(id, favoured))) + SAMPLED
    assert len({id(e) for e in pool}) == len(pool)
    assert all(any(e is c for c in endpoints) for e in pool)
    under = [e for e in pool if e.in_flight < bound]
    assert under == pool or (len(pool) == 1 and not under)  # over the bound only when all drawn were
    kept = [e for e in favoured if e.in_flight < bound]
    assert pool[: len({id(e) for e in kept})] == list({id(e): e for e in kept}.values())


def test_the_sample_spreads_over_the_whole_fleet() -> None:
    endpoints = fleet(1000, [0])
    rng = random.Random(3)
    seen = {id(e) for _ in range(2000) for e in candidates_for(endpoints, 1.0, rng)}
    assert len(seen) > 990
