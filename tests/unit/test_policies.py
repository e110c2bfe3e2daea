"""Routing invariants of every policy, stated once and checked on generated fleets."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.engine_state import EngineState
from corral.policy_names import POLICY_NAMES
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.filters import load_bound
from corral.router.routing.policies import LeastRequest, RoundRobin, SessionAffinity
from corral.router.routing.request import RouteRequest
from corral.router.routing.selector import build_policy

EPS = 0.25


def fleet(loads: list[int]) -> list[Endpoint]:
    endpoints = [
        Endpoint(f"http://10.0.0.{i}:8000", frozenset({"m"}), EngineState.READY) for i in range(len(loads))
    ]
    for e, load in zip(endpoints, loads, strict=True):
        e.in_flight = load
    return endpoints


def session_policy() -> SessionAffinity:
    return SessionAffinity(header="x-session-id", fallback=LeastRequest(seed=1), eps=EPS)


loads_st = st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=12)
headers_st = st.one_of(
    st.just({}),
    st.builds(lambda s: {"x-session-id": s}, st.text(min_size=1, max_size=20)),
)


@st.composite
def fleet_and_eligible(draw: st.DrawFn) -> tuple[list[Endpoint], list[Endpoint]]:
    endpoints = fleet(draw(loads_st))
    mask = draw(st.lists(st.booleans(), min_size=len(endpoints), max_size=len(endpoints)))
    eligible = [e for e, keep in zip(endpoints, mask, strict=True) if keep] or [endpoints[0]]
    return endpoints, eligible


@given(fleet_and_eligible(), headers_st, st.sampled_from(POLICY_NAMES), st.integers(1, 20))
def test_no_policy_picks_outside_the_eligible_set(
    fe: tuple[list[Endpoint], list[Endpoint]], headers: dict[str, str], name: str, rounds: int
) -> None:
    _, eligible = fe
    policy = build_policy(name, "x-session-id", seed=0)
    request = RouteRequest("m", headers)
    for _ in range(rounds):
        picked = policy.pick(eligible, request)
        assert any(picked is e for e in eligible)


@given(fleet_and_eligible(), st.text(min_size=1, max_size=20))
def test_session_pick_respects_the_load_bound(
    fe: tuple[list[Endpoint], list[Endpoint]], session: str
) -> None:
    _, eligible = fe
    bound = load_bound(eligible, EPS)
    picked = session_policy().pick(eligible, RouteRequest("m", {"x-session-id": session}))
    assert picked.in_flight + 1 <= bound
    mean_after = (sum(e.in_flight for e in eligible) + 1) / len(eligible)
    assert bound == math.ceil((1 + EPS) * mean_after)


@given(st.integers(1, 8), st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=40))
def test_bounded_load_holds_while_requests_pile_up(n: int, sessions: list[str]) -> None:
    """Requests that never finish, placed one by one: no endpoint ever passes the bound."""
    eligible = fleet([0] * n)
    policy = session_policy()
    for s in sessions:
        picked = policy.pick(eligible, RouteRequest("m", {"x-session-id": s}))
        bound = load_bound(eligible, EPS)
        assert picked.in_flight + 1 <= bound
        picked.in_flight += 1
        assert max(e.in_flight for e in eligible) <= bound


@given(fleet_and_eligible(), st.text(min_size=1, max_size=20), st.data())
def test_session_stays_on_its_endpoint_while_eligible_and_under_bound(
    fe: tuple[list[Endpoint], list[Endpoint]], session: str, data: st.DataObject
) -> None:
    endpoints, eligible = fe
    for e in endpoints:
        e.in_flight = 0
    policy = session_policy()
    request = RouteRequest("m", {"x-session-id": session})
    home = policy.pick(eligible, request)
    # Same set, same answer, every time.
    assert all(policy.pick(eligible, request) is home for _ in range(3))
    # Other endpoints leave the eligible set: the session does not move.
    others = [e for e in eligible if e is not home]
    keep = data.draw(st.lists(st.booleans(), min_size=len(others), max_size=len(others)))
    shrunk = [e for e in eligible if e is home or keep[others.index(e)]]
    assert policy.pick(shrunk, request) is home
    # Loads change elsewhere; as long as home stays under the bound, the session stays.
    for e in shrunk:
        e.in_flight = data.draw(st.integers(0, 30))
    if home.in_flight < load_bound(shrunk, EPS):
        assert policy.pick(shrunk, request) is home


@given(fleet_and_eligible(), st.text(min_size=1, max_size=20))
def test_session_moves_off_an_endpoint_that_is_no_longer_eligible(
    fe: tuple[list[Endpoint], list[Endpoint]], session: str
) -> None:
    _, eligible = fe
    if len(eligible) < 2:
        return
    policy = session_policy()
    request = RouteRequest("m", {"x-session-id": session})
    home = policy.pick(eligible, request)
    rest = [e for e in eligible if e is not home]
    assert policy.pick(rest, request) is not home


def test_session_without_header_falls_back_to_least_request() -> None:
    eligible = fleet([5, 0])
    policy = session_policy()
    # Power of two choices over two endpoints always compares both: the idle one wins.
    assert all(policy.pick(eligible, RouteRequest("m", {})) is eligible[1] for _ in range(20))


def test_sessions_spread_over_endpoints() -> None:
    eligible = fleet([0, 0, 0, 0])
    policy = session_policy()
    homes = {policy.pick(eligible, RouteRequest("m", {"x-session-id": f"user-{i}"})).url for i in range(200)}
    assert len(homes) == 4


@settings(max_examples=50, deadline=None)
@given(loads_st)
def test_least_request_never_picks_the_busiest_of_two(loads: list[int]) -> None:
    eligible = fleet(loads)
    policy = LeastRequest(seed=3)
    for _ in range(10):
        picked = policy.pick(eligible, RouteRequest("m", {}))
        if len(eligible) == 2:
            assert picked.in_flight == min(loads)


def test_round_robin_cycles() -> None:
    eligible = fleet([0, 0, 0])
    policy = RoundRobin()
    picks = [policy.pick(eligible, RouteRequest("m", {})) for _ in range(6)]
    assert picks == eligible + eligible


def test_unknown_policy_name_is_refused() -> None:
    try:
        build_policy("random")
    except ValueError as exc:
        assert "round_robin" in str(exc)
    else:
        raise AssertionError("expected ValueError")
