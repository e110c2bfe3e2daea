"""The routing room's seams: one ring cache behind the session policy and both ring scorers (so they
name the same home), the cache's reuse and rebuild rules, and `request.py` staying a leaf."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import corral.router.routing.request as request_module
from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.membership.membership import Membership
from corral.router.routing.load_board import LoadBoard
from corral.router.routing.policies import LeastRequest, SessionAffinity
from corral.router.routing.request import RouteRequest
from corral.router.routing.rings import RING_CACHE_SIZE, RingCache
from corral.router.routing.scorers import PickContext, SessionScorer


def fleet(n: int, prefix: str = "10.0.0") -> list[Endpoint]:
    return [Endpoint(f"http://{prefix}.{i}:8000", frozenset({"m"}), EngineState.READY) for i in range(n)]


@given(st.integers(2, 12), st.text(min_size=1, max_size=20))
def test_the_session_policy_and_the_session_scorer_name_the_same_home(n: int, session: str) -> None:
    endpoints = fleet(n)
    request = RouteRequest("m", {"x-session-id": session})
    picked = SessionAffinity("x-session-id", LeastRequest(seed=0), eps=0.25).pick(endpoints, request)
    scores = SessionScorer("x-session-id").score(endpoints, PickContext(request, endpoints, LoadBoard()))
    assert scores == [1.0 if e is picked else 0.0 for e in endpoints]


def test_a_candidate_set_keeps_its_ring_until_its_endpoints_are_new_objects() -> None:
    cache = RingCache()
    endpoints = fleet(3)
    ring = cache.ring(endpoints)
    assert cache.ring(list(endpoints)) is ring
    assert cache.ring(endpoints[:2]) is not ring
    came_back = [*endpoints[:2], Endpoint(endpoints[2].url, frozenset({"m"}), EngineState.READY)]
    rebuilt = cache.ring(came_back)
    assert rebuilt is not ring
    assert rebuilt.endpoints == tuple(came_back)


def test_the_cache_holds_at_most_its_size_of_sets() -> None:
    cache = RingCache()
    first = fleet(2, "10.9.9")
    ring = cache.ring(first)
    for i in range(RING_CACHE_SIZE):
        cache.ring(fleet(2, f"10.1.{i}"))
    assert cache.ring(first) is not ring  # emptied whole when full, then built again


def test_the_request_module_imports_no_other_routing_module() -> None:
    tree = ast.parse(Path(request_module.__file__).read_text(encoding="utf-8"))
    imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    assert not [name for name in imported if name.startswith("corral.router.routing")]


@given(st.integers(1, 40), st.integers(0, 2**64 - 1), st.data())
def test_ordered_is_the_walk_filtered_to_the_pool(n: int, key: int, data: st.DataObject) -> None:
    endpoints = fleet(n)
    ring = RingCache().ring(endpoints)
    pool = data.draw(st.lists(st.sampled_from(endpoints), unique_by=id, max_size=n))
    outsider = Endpoint(endpoints[0].url, frozenset({"m"}), EngineState.READY)  # same url, not a member
    wanted = {id(e) for e in pool}
    assert ring.ordered(key, [*pool, outsider]) == [e for e in ring.walk(key) if id(e) in wanted]


def test_a_membership_set_finds_its_ring_by_identity_and_a_change_rehashes_nothing_known() -> None:
    m = Membership()
    for e in fleet(5):
        m.add(e, "test")
    cache = RingCache()
    eligible = m.eligible("m")
    ring = cache.ring(eligible)
    assert cache.ring(m.eligible("m")) is ring  # the same set: found without reading its urls
    m.add(Endpoint("http://10.0.0.9:8000", frozenset({"m"}), EngineState.READY), "test")
    bigger = cache.ring(m.eligible("m"))
    assert bigger is not ring and len(bigger.endpoints) == 6


@given(st.integers(2, 30), st.data())
def test_a_ring_of_a_set_is_the_shared_ring_walked_past_the_others(n: int, data: st.DataObject) -> None:
    """Sets seen one after another (as membership changes) walk exactly as a ring of each set alone."""
    endpoints = fleet(n)
    cache = RingCache()
    for _ in range(3):
        subset = data.draw(st.lists(st.sampled_from(endpoints), unique_by=id, min_size=1, max_size=n))
        key = data.draw(st.integers(0, 2**64 - 1))
        alone = RingCache().ring(subset)
        assert list(cache.ring(subset).walk(key)) == list(alone.walk(key))
        assert sorted(id(e) for e in alone.walk(key)) == sorted(id(e) for e in subset)
