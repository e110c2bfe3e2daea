"""The bounded candidate set of scored picks on large fleets (`filters.candidates_for`): the favoured
endpoints and a random sample, each once; small fleets score everyone. And a scored policy on a large
fleet still finds the prompt's holder wherever the holder is (`filters.favored`)."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.membership.membership import Membership
from corral.router.routing.filters import SAMPLED, SCORE_ALL_UP_TO, candidates_for, first_holders
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.request import RouteRequest
from corral.router.routing.selector import build_policy


def fleet(n: int) -> list[Endpoint]:
    return [
        Endpoint(f"http://10.0.{i // 256}.{i % 256}:8000", frozenset({"m"}), EngineState.READY)
        for i in range(n)
    ]


@given(st.integers(1, SCORE_ALL_UP_TO))
def test_a_small_fleet_scores_every_endpoint(n: int) -> None:
    endpoints = fleet(n)
    assert candidates_for(endpoints, random.Random(0), lambda: endpoints[:1]) is endpoints


@given(
    st.integers(SCORE_ALL_UP_TO + 1, 400), st.integers(0, 2**32), st.lists(st.integers(0, 399), max_size=4)
)
def test_a_large_fleet_scores_the_favoured_first_and_a_sample(
    n: int, seed: int, favoured_at: list[int]
) -> None:
    endpoints = fleet(n)
    favoured = [endpoints[i % n] for i in favoured_at]
    pool = candidates_for(endpoints, random.Random(seed), lambda: favoured)
    distinct = list({id(e): e for e in favoured}.values())
    assert len(distinct) <= len(pool) <= len(distinct) + SAMPLED
    assert len({id(e) for e in pool}) == len(pool)
    assert list(pool[: len(distinct)]) == distinct
    assert all(any(e is c for c in endpoints) for e in pool)


def test_the_sample_spreads_over_the_whole_fleet() -> None:
    endpoints = fleet(1000)
    rng = random.Random(3)
    seen = {id(e) for _ in range(5000) for e in candidates_for(endpoints, rng)}
    assert len(seen) > 990


def chat(system: str, user: str) -> RouteRequest:
    payload = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    return RouteRequest("m", {}, payload)


def test_on_a_large_fleet_the_prefix_policy_returns_to_the_holder_of_a_prompt() -> None:
    """1,000 endpoints: each prompt group's second and later requests go where its first went (the
    holder is scored although no sample would find it), and new groups spread over many endpoints."""
    membership = Membership()
    for e in fleet(1000):
        membership.add(e, "test")
    policy = build_policy("prefix", seed=7)
    homes: dict[int, Endpoint] = {}
    for turn in range(3):
        for group in range(50):
            system = f"group {group} " + "shared system prompt text " * 30
            chosen = policy.pick(membership.eligible("m"), chat(system, f"turn {turn}"))
            assert homes.setdefault(group, chosen) is chosen
    assert len({id(e) for e in homes.values()}) > 40


def test_the_prefix_memory_names_the_holders_of_a_key_as_it_forgets_them() -> None:
    a, b = fleet(2)
    first, second, third = (chat(f"group {g} " + "system prompt " * 20, "q") for g in range(3))
    memory = PrefixMemory(keys_per_endpoint=2 * len(PrefixMemory().keys(first)))  # two prompts' keys
    memory.sent(first, a)
    memory.sent(first, b)
    memory.sent(second, a)
    assert sorted(memory.holders(first)) == [a.url, b.url] and list(memory.holders(second)) == [a.url]
    memory.sent(third, a)  # a keeps two keys: `first`, its oldest, is forgotten there
    assert list(memory.holders(first)) == [b.url] and list(memory.holders(third)) == [a.url]
    memory.forget(b.url, "left")
    assert list(memory.holders(first)) == [] and list(memory.holders(chat("short", "q"))) == []


@given(st.lists(st.integers(0, 3), min_size=0, max_size=40), st.integers(1, 3), st.integers(1, 6))
def test_a_hot_prefix_scores_a_bounded_number_of_its_holders_the_unloaded_first(
    loads: list[int], bound: int, limit: int
) -> None:
    endpoints = fleet(len(loads))
    for e, load in zip(endpoints, loads, strict=True):
        e.in_flight = load
    members = {e.url: e for e in endpoints[::2]}  # the odd ones left membership: never named
    urls = [e.url for e in endpoints]
    chosen = first_holders(urls, members, bound, limit)
    eligible = [e for e in endpoints if e.url in members]
    under = [e for e in eligible if e.in_flight < bound]
    over = [e for e in eligible if e.in_flight >= bound]
    assert chosen == (under + over)[:limit]
