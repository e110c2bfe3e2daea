"""Slow start (corral.router.routing.slow_start): the ramp's curve, and in every policy a warming
endpoint takes well under its share early in the ramp and its full share after it, the pool never
empties, 0 turns it off; membership stamps where the ramp begins (READY, group whole, ejection)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.engine_state import EngineState
from corral.policy_names import POLICY_NAMES
from corral.router.membership.endpoint import Endpoint
from corral.router.membership.group_tag import group_tag
from corral.router.membership.membership import Membership
from corral.router.routing.config import PolicyConfigError, RoutingConfig, load_routing_config
from corral.router.routing.load_board import LoadBoard
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.request import Policy, RouteRequest
from corral.router.routing.selector import build_policy, build_scored
from corral.router.routing.slow_start import FLOOR, SlowStart, SlowStartError, warmup_weight

SECONDS = 10.0
PICKS = 4000  # over one ramp; as many again after it
OPEN = 6  # requests each pick leaves open (the oldest finishes): least request and load see load


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fleet(n: int, at: float) -> list[Endpoint]:
    endpoints = [Endpoint(f"http://10.0.0.{i}:8000", frozenset({"m"}), EngineState.READY) for i in range(n)]
    for e in endpoints:
        e.routable_from = at - 10 * SECONDS  # long routable
    return endpoints


def request_maker(policy: str) -> Callable[[int], RouteRequest]:
    def make(i: int) -> RouteRequest:
        if policy == "session":
            return RouteRequest("m", {"x-session-id": f"session-{i % 997}"})
        # a new prefix each time: the ring home decides, as for traffic with fresh prompts
        text = f"tenant {i} " + "You answer questions about tide tables. " * 6
        return RouteRequest("m", {}, {"messages": [{"role": "system", "content": text}]})

    return make


def shares(policy: Policy, seconds: float, n: int = 4) -> tuple[float, float, float]:
    """The warming endpoint's share of picks in the first fifth of the ramp, over the whole ramp,
    and after it, with every pick leaving a request open for the next `OPEN` picks."""
    clock = Clock()
    endpoints = fleet(n, clock.now)
    warming = endpoints[-1]
    warming.routable_from = clock.now
    gate = SlowStart(policy, seconds, clock=clock, boot_seconds=0)
    make = request_maker(policy.name)
    open_: deque[Endpoint] = deque()
    taken = [0, 0, 0]  # first fifth, whole ramp, after
    counted = [0, 0, 0]
    for i in range(2 * PICKS):
        clock.now = 1000.0 + i * SECONDS / PICKS
        chosen = gate.pick(endpoints, make(i))
        assert chosen in endpoints
        chosen.in_flight += 1
        open_.append(chosen)
        if len(open_) > OPEN:
            open_.popleft().in_flight -= 1
        for k, inside in enumerate((i < PICKS / 5, i < PICKS, i >= PICKS)):
            if inside:
                counted[k] += 1
                taken[k] += chosen is warming
    first, ramp, after = (t / c for t, c in zip(taken, counted, strict=True))
    return first, ramp, after


def test_the_weight_rises_from_the_floor_to_one_over_the_ramp() -> None:
    assert warmup_weight(0, 10) == FLOOR
    assert warmup_weight(5, 10) == pytest.approx(FLOOR + (1 - FLOOR) / 2)
    assert warmup_weight(10, 10) == 1.0
    assert warmup_weight(99, 10) == 1.0
    assert warmup_weight(-3, 10) == FLOOR  # an ejection not over yet: still the floor
    assert warmup_weight(0, 0) == 1.0  # 0: off


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_gives_a_warming_endpoint_well_under_its_share_then_all_of_it(name: str) -> None:
    full = shares(build_policy(name, seed=7), 0.0)[2]  # its share without slow start
    first, ramp, after = shares(build_policy(name, seed=7), SECONDS)
    print(f"{name}: full {full:.3f}; slow start: first fifth {first:.3f}, ramp {ramp:.3f}, after {after:.3f}")
    assert full > 0.1
    # the mean weight over the first fifth is 0.19; the cap holds it there whatever the policy prefers
    assert first < 0.35 * full
    assert ramp < 0.75 * full  # the mean weight over the ramp is 0.55
    assert after > 0.8 * full


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_zero_seconds_gives_the_full_share_at_once(name: str) -> None:
    first, _, after = shares(build_policy(name, seed=7), 0.0)
    assert first > 0.6 * after


def test_every_candidate_warming_still_picks() -> None:
    clock = Clock()
    endpoints = fleet(3, clock.now)
    for e in endpoints:
        e.routable_from = clock.now
    gate = SlowStart(build_policy("round_robin"), SECONDS, clock=clock, boot_seconds=0)
    picked = {gate.pick(endpoints, RouteRequest("m", {})).url for _ in range(30)}
    assert picked == {e.url for e in endpoints}


def test_endpoints_routable_together_share_alike() -> None:
    """A router starting (or a whole fleet coming up): everyone ramps from the same instant, so
    nobody is held back; there is no warm peer to carry the load."""
    clock = Clock()
    endpoints = fleet(4, clock.now)
    for e in endpoints:
        e.routable_from = clock.now
    gate = SlowStart(build_policy("least_request", seed=2), SECONDS, clock=clock, boot_seconds=0)
    got = [gate.pick(endpoints, RouteRequest("m", {})) for _ in range(400)]
    assert min(got.count(e) for e in endpoints) > 0.2 * len(got)


@settings(max_examples=200, deadline=None)
@given(
    ages=st.lists(st.floats(min_value=-5, max_value=30), min_size=1, max_size=6),
    name=st.sampled_from(POLICY_NAMES),
    picks=st.integers(min_value=1, max_value=40),
)
def test_the_pick_is_always_one_of_the_candidates(ages: list[float], name: str, picks: int) -> None:
    clock = Clock()
    endpoints = fleet(len(ages), clock.now)
    for e, age in zip(endpoints, ages, strict=True):
        e.routable_from = clock.now - age
    gate = SlowStart(build_policy(name, seed=1), SECONDS, clock=clock, boot_seconds=0)
    make = request_maker(name)
    for i in range(picks):
        assert gate.pick(endpoints, make(i)) in endpoints
        clock.now += 0.1


def test_the_cap_holds_under_a_policy_that_prefers_the_idle_endpoint() -> None:
    """Least request picks the idle newcomer whenever it samples it; the cap still holds it to its
    weight times the mean share, plus at most one request of credit."""
    clock = Clock()
    endpoints = fleet(10, clock.now)
    for e in endpoints[:-1]:
        e.in_flight = 50
    new = endpoints[-1]
    new.routable_from = clock.now
    gate = SlowStart(build_policy("least_request", seed=3), SECONDS, clock=clock, boot_seconds=0)
    earned = 0.0
    for _ in range(1000):
        earned += warmup_weight(clock.now - new.routable_from, SECONDS) / len(endpoints)
        gate.pick(endpoints, RouteRequest("m", {}))
        assert new.ramp_taken <= earned + 1
        clock.now += SECONDS / 2000


def test_per_model_ramps_and_off_for_one_model() -> None:
    clock = Clock()
    endpoints = fleet(4, clock.now)
    endpoints[-1].routable_from = clock.now
    gate = SlowStart(build_policy("round_robin"), SECONDS, {"m": 0.0}, clock=clock, boot_seconds=0)
    got = [gate.pick(endpoints, RouteRequest("m", {})) for _ in range(40)]
    assert got.count(endpoints[-1]) == 10  # m has no ramp: round robin's quarter at once
    assert gate.seconds_for("other") == SECONDS
    assert gate.to_json(endpoints[-1]) is not None
    with pytest.raises(SlowStartError, match=r"slow_start_models\.x"):
        SlowStart(build_policy("round_robin"), 1.0, {"x": -1.0})
    assert SlowStart(build_policy("round_robin"), 0.0).to_json(endpoints[0]) is None


def test_the_policy_config_reads_ramps_and_names_bad_ones(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text("slow_start_seconds: 20\nslow_start_models: {m: 0, n: 5}\n")
    config = load_routing_config(path)
    assert config.slow_start_seconds == 20 and config.slow_start_models == {"m": 0, "n": 5}
    path.write_text("slow_start_models: {m: -2}\n")
    with pytest.raises(PolicyConfigError, match=r"slow_start_models.*>= 0"):
        load_routing_config(path)


def test_membership_stamps_where_the_ramp_begins() -> None:
    membership = Membership()
    e = membership.add(Endpoint("http://10.0.0.1:8000", frozenset({"m"})), "test")
    e.routable_from = stamp = -1.0
    membership.update(e.url, "probe ok", state=EngineState.READY)
    assert e.routable_from > stamp  # first READY
    e.routable_from = stamp
    membership.update(e.url, "asleep", state=EngineState.SLEEPING)
    assert e.routable_from == stamp
    membership.update(e.url, "woken", state=EngineState.READY)
    assert e.routable_from > stamp  # READY again
    seconds = e.eject(e.routable_from, 5.0)
    assert seconds is not None and e.routable_from == e.ejected_until  # ramps up when back


def test_a_group_ramps_from_when_it_became_whole() -> None:
    membership = Membership()
    tag = group_tag("g", 2)
    a = membership.add(Endpoint("http://10.0.0.1:8000", frozenset({"m"}), EngineState.READY, group=tag), "t")
    a.routable_from = -1.0
    b = membership.add(Endpoint("http://10.0.0.2:8000", frozenset({"m"}), EngineState.READY, group=tag), "t")
    assert a.routable_from > -1.0 and b.in_routing


@pytest.mark.parametrize("seconds", [SECONDS, 0.0])
def test_a_warming_prefix_home_takes_new_prefixes_gradually(seconds: float) -> None:
    """The prefix memory learns where each new key went: over the first fifth of the ramp the warming
    engine becomes the holder of far fewer keys than a warm peer (with 0 s, as many)."""
    clock = Clock()
    endpoints = fleet(4, clock.now)
    new = endpoints[-1]
    new.routable_from = clock.now
    memory = PrefixMemory()
    policy = build_scored("prefix", RoutingConfig(), LoadBoard(), "x-session-id", 5, memory)
    gate = SlowStart(policy, seconds, clock=clock, boot_seconds=0)
    make = request_maker("prefix")
    for i in range(PICKS // 5):
        clock.now = 1000.0 + i * SECONDS / PICKS
        gate.pick(endpoints, make(i))
    peers = sum(memory.placed(e) for e in endpoints[:-1]) / 3
    print(f"slow start {seconds} s: keys held by the new engine {memory.placed(new)}, a peer {peers:.0f}")
    if seconds:
        assert memory.placed(new) < 0.35 * peers
    else:
        assert memory.placed(new) > 0.6 * peers


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_newcomer_after_the_router_started_is_capped_in_every_policy(name: str) -> None:
    """Issue 28: a router started 4 s before engine B joined (ramp 10 s, so the endpoint present at
    start is itself inside the ramp's window): B earns at most its weight of the mean share. Before,
    both were over their caps after one pick each and the fallback offered both, so round robin gave
    B half the requests."""
    clock = Clock()
    gate = SlowStart(build_policy(name, seed=5), SECONDS, clock=clock)  # the router starts now
    endpoints = fleet(2, clock.now)
    a, b = endpoints
    a.routable_from = clock.now + 0.3  # its first probe round
    clock.now += 4.0
    b.routable_from = clock.now
    make = request_maker(name)
    picks = 1000
    taken = 0
    for i in range(picks):  # the newcomer's first 2 s
        clock.now = b.routable_from + i * 2.0 / picks
        chosen = gate.pick(endpoints, make(i))
        taken += chosen is b
    share = taken / picks
    # its weight over its first 2 s averages 0.19, so at most ~0.1 of two engines' picks
    print(f"{name}: the newcomer took {share:.3f} of its first 2 s")
    assert share < 0.15
    assert gate.weight(a) == 1.0 and gate.weight(b) < 0.3  # A was present when the router started


def test_a_newcomer_ramps_against_a_warming_peer_not_as_its_equal() -> None:
    """Two engines that both turn READY after the router's start, 3 s apart: the older is never capped
    (it carries the load the newer may not take), the newer earns its weight relative to the older's."""
    clock = Clock()
    gate = SlowStart(build_policy("round_robin"), SECONDS, clock=clock)
    clock.now += 20.0  # long after the router started
    endpoints = fleet(3, clock.now)  # one warm peer
    old, b, c = endpoints
    b.routable_from = clock.now
    clock.now += 3.0
    c.routable_from = clock.now
    picks = 600
    got = [gate.pick(endpoints, RouteRequest("m", {})) for _ in range(picks)]
    # weights: old 1, b 0.37, c 0.1, each capped at weight / 3 of the picks
    assert got.count(c) < 0.1 * picks
    assert got.count(b) < 0.2 * picks
    assert got.count(old) > 0.7 * picks


def test_endpoints_present_when_the_router_starts_do_not_ramp() -> None:
    clock = Clock()
    gate = SlowStart(build_policy("round_robin"), SECONDS, clock=clock)
    endpoints = fleet(3, clock.now)
    for e in endpoints:
        e.routable_from = clock.now + 0.5
    clock.now += 1.0
    assert all(gate.weight(e) == 1.0 for e in endpoints)
    got = [gate.pick(endpoints, RouteRequest("m", {})) for _ in range(30)]
    assert {got.count(e) for e in endpoints} == {10}
