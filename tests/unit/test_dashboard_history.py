"""The router's 15 minutes of chart points: rates from differences of cumulative readings, a model's
rates from the router's own count (an engine leaving takes nothing with it), rings bounded however
many engines there are, and a rollout followed from the engines' bundles."""

from __future__ import annotations

import math
from typing import Any

import pytest

from corral.contracts.supervisor import StateLine
from corral.contracts.traffic import LatencyHistogram
from corral.engine_state import EngineState
from corral.router.dashboard.history import SERIES, FleetHistory
from corral.router.dashboard.rollout import RolloutWatch


def engine(url: str, requests: int, ttfts: list[float], **more: Any) -> dict[str, Any]:
    ttft = LatencyHistogram.of_values(ttfts).to_wire()
    traffic = {"requests": requests, "errors": 0, "ttft": ttft, "itl": {"counts": [], "sum": 0.0}}
    return {"url": url, "name": url.rsplit("/", 1)[-1], "models": ["m"], "traffic": traffic, **more}


def test_points_are_rates_and_quantiles_of_each_step_and_a_model_keeps_a_departed_engines_requests() -> None:
    history = FleetHistory(step=5, span=60)
    a, b = engine("http://a", 0, []), engine("http://b", 0, [])
    history.sample({"endpoints": [a, b], "model_requests": {"m": {"requests": 0}}}, wall=1000.0, now=0.0)
    a = engine("http://a", 50, [0.1] * 50, load={"kv_usage": 0.5, "waiting": 3})
    b = engine("http://b", 50, [0.3] * 50, load={"kv_usage": 0.25, "waiting": 1})
    history.sample({"endpoints": [a, b], "model_requests": {"m": {"requests": 100}}}, wall=1005.0, now=5.0)
    # b retired: the router answered 100 more for the model, a saw only 50 of them (b served the rest first)
    a = engine("http://a", 100, [0.1] * 100)
    history.sample({"endpoints": [a], "model_requests": {"m": {"requests": 200}}}, wall=1010.0, now=10.0)
    body = history.to_json()
    assert body["times"] == [1000.0, 1005.0, 1010.0] and body["series"] == list(SERIES)
    model = body["models"]["m"]
    assert model["rate"] == [None, 20.0, 20.0]  # 100 per 5 s, each step: not 10 once b left
    assert 100 <= model["ttft_p50_ms"][1] <= 300 and model["ttft_p95_ms"][1] > 250
    assert model["kv_usage"][1] == pytest.approx(0.375) and model["waiting"][1] == 4
    engines = body["engines"]
    assert engines["http://a"]["rate"] == [None, 10.0, 10.0] and engines["http://a"]["present"]
    assert engines["http://b"]["rate"] == [None, 10.0, None] and not engines["http://b"]["present"]
    assert engines["http://a"]["kv_usage"][1] == 0.5 and engines["http://a"]["waiting"][1] == 3


def test_memory_is_bounded_at_a_thousand_engines_and_points_age_out() -> None:
    history = FleetHistory(step=5, span=60, engines=64, models=4)
    endpoints = [engine(f"http://10.0.{i // 250}.{i % 250}:8000", i, [0.1] * (i % 7)) for i in range(1000)]
    for tick in range(40):
        history.sample({"endpoints": endpoints}, wall=float(tick * 5), now=float(tick * 5))
    body = history.to_json()
    assert len(body["times"]) == 12  # a 60 s span at 5 s: twelve points, whatever the ticks
    assert len(body["engines"]) == 64 and body["engines_uncharted"] == 936
    assert all(len(e["rate"]) == 12 for e in body["engines"].values())
    # a charted engine that leaves gives its ring to a listed one only once it is gone
    history.sample({"endpoints": endpoints[64:]}, wall=205.0, now=205.0)
    after = history.to_json()["engines"]
    assert len(after) == 64 and not any(url in after for url in (e["url"] for e in endpoints[:64]))


def test_a_ring_of_an_engine_gone_for_the_whole_span_is_forgotten() -> None:
    history = FleetHistory(step=5, span=20)
    history.sample({"endpoints": [engine("http://a", 0, [])]}, wall=0.0, now=0.0)
    for tick in range(1, 5):
        history.sample({"endpoints": []}, wall=tick * 5.0, now=tick * 5.0)
    assert history.to_json()["engines"] == {}


def test_hostile_numbers_in_a_view_are_no_points() -> None:
    history = FleetHistory(step=5, span=60)
    bad = {
        "url": "http://x",
        "models": ["m"],
        "traffic": {"requests": -5, "ttft": {"counts": "no"}},
        "load": {"kv_usage": math.inf, "waiting": True},
    }
    history.sample({"endpoints": [bad, "nonsense", {"url": 3}]}, wall=0.0, now=0.0)
    history.sample({"endpoints": [bad]}, wall=5.0, now=5.0)
    x = history.to_json()["engines"]["http://x"]
    assert x["rate"] == [None, 0.0] and x["kv_usage"] == [None, None] and x["waiting"] == [None, None]


def fleet(bundles: dict[str, tuple[str, str]], errors: int, **engine: Any) -> dict[str, Any]:
    """Engines by name -> (bundle fingerprint, group), on supervisors that name their bundles; every
    engine serves model m unless `engine` says otherwise (models, role: a function of the name)."""
    names = {"f1": "v1", "f2": "v2"}
    endpoints = [
        {
            "url": f"http://{n}",
            "name": n,
            "group": g,
            "models": ["m"],
            "supervisor": {"fingerprint": f, "bundle_name": names[f]},
            **{key: value(n) for key, value in engine.items()},
        }
        for n, (f, g) in bundles.items()
    ]
    return {"endpoints": endpoints, "totals": {"errors": errors}}


def test_engines_that_serve_different_things_on_different_bundles_are_no_rollout() -> None:
    """Two models, or prefill and decode engines, run different bundles for good."""
    watch = RolloutWatch()
    two = {"e0": ("f1", "g0"), "e1": ("f2", "g1")}
    models = watch.update(fleet(two, 0, models=lambda n: ["a"] if n == "e0" else ["b"]), wall=0.0)
    roles = watch.update(fleet(two, 0, role=lambda n: "prefill" if n == "e0" else "decode"), wall=1.0)
    assert models["active"] is None and roles["active"] is None
    rolling = watch.update(fleet({**two, "e2": ("f2", "g2")}, 0), wall=2.0)  # all three serve m
    assert rolling["active"] is not None and (rolling["active"]["from"], rolling["active"]["to"]) == (
        ["v1"],
        "v2",
    )


def test_a_rollout_is_the_second_bundle_appearing_and_ends_when_one_is_left() -> None:
    watch = RolloutWatch(keep_ended=100)
    assert watch.update(fleet({"e0": ("f1", "g0"), "e1": ("f1", "g1")}, errors=3), wall=0.0)["active"] is None
    started = watch.update(fleet({"e0": ("f1", "g0"), "e1": ("f1", "g1"), "e2": ("f2", "g2")}, 3), wall=10.0)
    assert started["active"] == {
        "from": ["v1"],
        "to": "v2",
        "groups_moved": 1,
        "groups": 2,
        "failed": 0,
        "since": 10.0,
        "leaving": ["http://e0", "http://e1"],
    }
    half = watch.update(fleet({"e1": ("f1", "g1"), "e2": ("f2", "g2"), "e3": ("f2", "g3")}, 5), wall=20.0)[
        "active"
    ]
    assert (half["groups_moved"], half["groups"], half["failed"]) == (
        2,
        2,
        2,
    )  # g0 moved; 2 failed since it began
    done = watch.update(fleet({"e2": ("f2", "g2"), "e3": ("f2", "g3")}, 5), wall=30.0)
    assert done["active"] is None
    assert done["last"] is not None and (
        done["last"]["to"],
        done["last"]["ended"],
        done["last"]["failed"],
    ) == (
        "v2",
        30.0,
        2,
    )
    assert watch.update(fleet({"e2": ("f2", "g2")}, 5), wall=131.0)["last"] is None  # kept for a while only


@pytest.mark.parametrize("name", ["x" * 129, "x" * 100_000, 42, ["v2"], {"name": "v2"}, None])
def test_a_state_lines_bundle_name_that_is_not_a_short_string_is_read_as_absent(name: object) -> None:
    """A supervisor's state line is untrusted input: its bundle name is shown on every dashboard."""
    line = StateLine.model_validate({"epoch": 1, "state": "READY", "bundle_name": name})
    assert line.bundle_name is None and line.state is EngineState.READY  # the line itself still counts
    assert StateLine.model_validate({"epoch": 1, "state": "READY", "bundle_name": "v2"}).bundle_name == "v2"
