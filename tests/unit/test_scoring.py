"""Scored routing: the invariants stated once and checked on generated fleets and arrival sequences
(the pick is eligible, the load bound holds, replicas agree on a prefix's home), plus the prompt key,
the metrics parser, staleness, the config file and the per-request policy header."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.config import PolicyConfigError, RoutingConfig, load_routing_config
from corral.router.routing.filters import load_bound
from corral.router.routing.load_board import EngineLoad, LoadBoard
from corral.router.routing.load_scraper import parse_engine_metrics
from corral.router.routing.pipeline import LOAD_WEIGHTS, PREFIX_WEIGHTS, ScoredPolicy
from corral.router.routing.prompt import leading_text, prefix_key
from corral.router.routing.request import RouteRequest
from corral.router.routing.selector import Routing

EPS = 0.25
SYSTEM = "You are a careful assistant for the sea charts team. " * 20  # ~1 KiB, > one key


def fleet(n: int, prefix: str = "10.0.0") -> list[Endpoint]:
    return [Endpoint(f"http://{prefix}.{i}:8000", frozenset({"m"}), EngineState.READY) for i in range(n)]


def chat(system: str, user: str) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }


def policy(name: str = "prefix", board: LoadBoard | None = None, seed: int = 0) -> ScoredPolicy:
    weights = PREFIX_WEIGHTS if name == "prefix" else LOAD_WEIGHTS
    return ScoredPolicy(name, weights, board or LoadBoard(), eps=EPS, seed=seed)


systems_st = st.sampled_from([f"group {g}: " + SYSTEM for g in range(12)] + ["short"])
payload_st = st.one_of(
    st.none(),
    st.builds(chat, systems_st, st.text(max_size=40)),
    st.builds(lambda p: {"model": "m", "prompt": p}, st.text(max_size=600)),
)
load_st = st.one_of(
    st.none(),
    st.builds(
        EngineLoad,
        running=st.integers(0, 64).map(float),
        waiting=st.integers(0, 64).map(float),
        kv_usage=st.floats(0, 1),
        at=st.floats(0, 2e6),
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    loads=st.lists(st.integers(0, 40), min_size=1, max_size=10),
    mask=st.lists(st.booleans(), min_size=10, max_size=10),
    metrics=st.lists(load_st, min_size=10, max_size=10),
    payload=payload_st,
    name=st.sampled_from(["prefix", "load"]),
)
def test_the_pick_is_always_eligible(
    loads: list[int], mask: list[bool], metrics: list[EngineLoad | None], payload: object, name: str
) -> None:
    endpoints = fleet(len(loads))
    board = LoadBoard(stale_after=1e6)
    for e, load, m in zip(endpoints, loads, metrics, strict=False):
        e.in_flight = load
        if m is not None:
            board.loads[e.url] = m
    eligible = [e for e, keep in zip(endpoints, mask, strict=False) if keep] or endpoints[:1]
    assert isinstance(payload, dict | type(None))
    picked = policy(name, board).pick(eligible, RouteRequest("m", {}, payload))
    assert any(picked is e for e in eligible)


# An arrival names a prompt group (or none: -1); a departure ends the k-th open request.
ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(-1, 5)),
        st.tuples(st.just("depart"), st.integers(0, 1000)),
    ),
    max_size=200,
)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 8), ops=ops_st, eps=st.sampled_from([0.0, 0.1, 0.25, 1.0]))
def test_bounded_load_holds_for_any_sequence_of_arrivals(
    n: int, ops: list[tuple[str, int]], eps: float
) -> None:
    endpoints = fleet(n)
    scored = ScoredPolicy("prefix", PREFIX_WEIGHTS, LoadBoard(), eps=eps, seed=1)
    open_requests: list[Endpoint] = []
    for op, arg in ops:
        if op == "depart":
            if open_requests:
                open_requests.pop(arg % len(open_requests)).in_flight -= 1
            continue
        payload = None if arg < 0 else chat(f"group {arg}: " + SYSTEM, "hi")
        picked = scored.pick(endpoints, RouteRequest("m", {}, payload))
        total = sum(e.in_flight for e in endpoints) + 1
        assert picked.in_flight + 1 <= math.ceil((1 + eps) * total / n)
        picked.in_flight += 1
        open_requests.append(picked)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(2, 9),
    removed=st.sets(st.integers(0, 8), max_size=3),
    loads_a=st.lists(st.integers(0, 20), min_size=9, max_size=9),
    loads_b=st.lists(st.integers(0, 20), min_size=9, max_size=9),
    group=st.integers(0, 1000),
    user=st.text(max_size=30),
)
def test_replicas_with_the_same_membership_make_the_same_prefix_choice(
    n: int, removed: set[int], loads_a: list[int], loads_b: list[int], group: int, user: str
) -> None:
    """Two replicas (their own Endpoint objects, rings, loads, seeds) agree on the home of a prefix
    whenever the home is within the load bound on both; at equal loads, always."""
    keep = [i for i in range(n) if i not in removed] or [0]
    a = [fleet(n)[i] for i in keep]
    b = [fleet(n)[i] for i in keep]
    payload = chat(f"group {group}: " + SYSTEM, user)
    request = RouteRequest("m", {}, payload)
    replica_a, replica_b = policy(seed=1), policy(seed=2)
    assert replica_a.pick(a, request).url == replica_b.pick(b, request).url
    for e, load in zip(a, loads_a, strict=False):
        e.in_flight = load
    for e, load in zip(b, loads_b, strict=False):
        e.in_flight = load
    prefix = replica_a.scorers[0][0]
    home = next(iter(prefix.home_order(a, _ctx(a, request))))  # type: ignore[attr-defined]
    home_b = next(e for e in b if e.url == home.url)
    if home.in_flight < load_bound(a, EPS) and home_b.in_flight < load_bound(b, EPS):
        assert replica_a.pick(a, request).url == home.url == replica_b.pick(b, request).url


def _ctx(eligible: list[Endpoint], request: RouteRequest):  # type: ignore[no-untyped-def]
    from corral.router.routing.scorers import PickContext

    return PickContext(request, eligible, LoadBoard())


def test_a_group_shares_one_home_and_the_groups_spread() -> None:
    endpoints = fleet(4)
    scored = policy()
    homes = {}
    for g in range(40):
        picks = {
            scored.pick(endpoints, RouteRequest("m", {}, chat(f"group {g}: " + SYSTEM, f"user {u}"))).url
            for u in range(5)
        }
        assert len(picks) == 1  # idle fleet: every user of a group goes home
        homes[g] = picks.pop()
    counts = [list(homes.values()).count(e.url) for e in endpoints]
    assert min(counts) >= 4, counts


def test_losing_an_endpoint_moves_only_its_own_prefixes() -> None:
    endpoints = fleet(5)
    scored = policy()
    requests = [RouteRequest("m", {}, chat(f"group {g}: " + SYSTEM, "q")) for g in range(60)]
    before = [scored.pick(endpoints, r).url for r in requests]
    gone = endpoints[2]
    after = [scored.pick([e for e in endpoints if e is not gone], r).url for r in requests]
    for b, a in zip(before, after, strict=True):
        if b != gone.url:
            assert a == b


def test_the_key_is_the_decoded_text_not_the_bytes() -> None:
    escaped = b'{"model":"m","prompt":"caf\\u00e9 ' + b"x" * 600 + b'"}'
    plain = '{"prompt":"café ' + "x" * 600 + '","model":"m"}'
    assert prefix_key(orjson.loads(escaped), 128, 4) == prefix_key(orjson.loads(plain), 128, 4)


def test_the_key_covers_whole_leading_blocks_only() -> None:
    assert prefix_key(chat(SYSTEM, "a"), 128, 4) == prefix_key(chat(SYSTEM, "b" * 500), 128, 4)
    assert prefix_key(chat("tiny", "x"), 128, 4) is None
    assert prefix_key({"prompt": ["a" * 300, "b" * 300]}, 128, 4) is None  # a batch has no home
    assert leading_text(chat("S", "U"), 100) == "<system>S\n<user>U\n"
    parts = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "T"}]}]}
    assert leading_text(parts, 100) == "<user>T\n"


def test_an_overloaded_home_spills_to_the_same_next_endpoint() -> None:
    endpoints = fleet(4)
    request = RouteRequest("m", {}, chat("group 7: " + SYSTEM, "q"))
    scored = policy()
    home = scored.pick(endpoints, request)
    home.in_flight = 10  # far over ceil(1.25 * 11 / 4) = 4
    second = scored.pick(endpoints, request)
    assert second is not home
    assert policy(seed=9).pick(endpoints, request) is second


def test_stale_metrics_count_as_saturated() -> None:
    endpoints = fleet(2)
    board = LoadBoard(stale_after=0.5)
    now = 1000.0
    board.loads[endpoints[0].url] = EngineLoad(running=0, waiting=0, kv_usage=0.0, at=now - 5)  # stale
    board.loads[endpoints[1].url] = EngineLoad(running=30, waiting=10, kv_usage=0.9, at=now)
    assert board.fresh(endpoints[0].url, now) is None
    scored = policy("load", board)
    import corral.router.routing.pipeline as pipeline

    real = pipeline.time.monotonic
    pipeline.time.monotonic = lambda: now  # type: ignore[assignment]
    try:
        picks = {scored.pick(endpoints, RouteRequest("m", {})).url for _ in range(20)}
    finally:
        pipeline.time.monotonic = real  # type: ignore[assignment]
    assert picks == {endpoints[1].url}


def test_metrics_parser_reads_the_routing_gauges() -> None:
    text = b"""# HELP vllm:num_requests_running x
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 99.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,chat",waiting_lora_adapters=""} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 12.0
"""
    load = parse_engine_metrics(text, 5.0)
    assert (load.running, load.waiting, load.kv_usage, load.at) == (5.0, 4.0, 0.5, 5.0)
    assert load.running_adapters == frozenset({"sql", "chat"})


def test_lora_affinity_prefers_the_engine_running_the_adapter() -> None:
    endpoints = fleet(3)
    for e in endpoints:
        e.models = frozenset({"m", "sql"})
    board = LoadBoard(stale_after=1e9)
    board.loads[endpoints[2].url] = EngineLoad(running_adapters=frozenset({"sql"}), at=1e12)
    scored = ScoredPolicy("lora", {"lora": 1.0, "in_flight": 0.1}, board, seed=0)
    assert {scored.pick(endpoints, RouteRequest("sql", {})).url for _ in range(10)} == {endpoints[2].url}


def test_policy_header_and_per_model_config(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(
        "policy: least_request\n"
        "policies:\n  cache-first: {weights: {prefix: 1.0, in_flight: 0.1}, eps: 0.5}\n"
        "models:\n  m: cache-first\n"
    )
    config = load_routing_config(path)
    routing = Routing("round_robin", config, "x-session-id", list)
    selector = routing.policy
    assert routing.scraper is None  # no configured policy reads engine metrics
    endpoints = fleet(4)
    request = RouteRequest("m", {}, chat("group 1: " + SYSTEM, "q"))
    assert len({selector.pick(endpoints, request).url for _ in range(8)}) == 1
    rr = RouteRequest("m", {"x-corral-policy": "round_robin"}, request.payload)
    assert len({selector.pick(endpoints, rr).url for _ in range(8)}) == 4
    unknown = RouteRequest("m", {"x-corral-policy": "nope"}, request.payload)
    assert selector.pick(endpoints, unknown).url == selector.pick(endpoints, request).url


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("policies:\n  x: {weights: {speed: 1}}\n", "unknown scorer"),
        ("models:\n  m: fastest\n", "neither built in nor under `policies:`"),
        ("scrape_interval: 0.001\n", "scrape_interval"),
        ("[1, 2", "not YAML or JSON"),
    ],
)
def test_config_errors_name_the_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(text)
    with pytest.raises(PolicyConfigError, match=message) as err:
        load_routing_config(path)
    assert str(path) in str(err.value)


def test_routing_scrapes_only_for_metric_scorers() -> None:
    assert Routing("prefix", RoutingConfig(), "x-session-id", list).scraper is not None
    assert Routing("round_robin", RoutingConfig(), "x-session-id", list).scraper is None
