"""The dashboard's per-model figures over a sliding window: differences of cumulative per-endpoint
readings, summed per model, with the window's age said while it is younger than the window."""

from __future__ import annotations

import random
from typing import Any

import pytest

from corral.contracts.traffic import LatencyHistogram, TrafficFigures
from corral.router.dashboard.windows import ModelWindows


class Endpoint:
    """One endpoint's cumulative counters, as `/v1/fleet` writes them."""

    def __init__(self, url: str, models: list[str], adapters: list[str] | None = None) -> None:
        self.url, self.models, self.adapters = url, models, adapters or []
        self.requests = self.errors = 0
        self.ttfts: list[float] = []

    def serve(self, n: int, ttft: float, errors: int = 0) -> None:
        self.requests += n
        self.errors += errors
        self.ttfts += [ttft] * (n - errors)

    def body(self) -> dict[str, Any]:
        ttft = LatencyHistogram.of_values(self.ttfts).to_wire()
        traffic = {"requests": self.requests, "errors": self.errors, "ttft": ttft, "itl": {}}
        return {"url": self.url, "models": self.models, "adapters": self.adapters, "traffic": traffic}


def fleet(*endpoints: Endpoint) -> dict[str, Any]:
    return {"endpoints": [e.body() for e in endpoints]}


def test_old_traffic_leaves_the_window_and_new_traffic_is_counted_per_base_model() -> None:
    windows = ModelWindows(window=60, sample_every=5)
    a, b = Endpoint("http://a", ["base", "base-lora"], ["base-lora"]), Endpoint("http://b", ["other"])
    a.serve(100, ttft=2.0, errors=10)  # before the window: slow and failing
    first = windows.update(fleet(a, b), now=0.0)
    assert first["covered_s"] == 0 and first["models"]["base"]["requests"] == 0
    for t in range(5, 65, 5):  # a minute later: the old requests are out of the window
        windows.update(fleet(a, b), now=float(t))
    a.serve(30, ttft=0.1)
    b.serve(4, ttft=0.5, errors=1)
    now = windows.update(fleet(a, b), now=66.0)
    assert now["window_s"] == 60 and now["covered_s"] == 60
    base = now["models"]["base"]
    assert base["requests"] == 30 and base["errors"] == 0 and base["error_share"] == 0
    assert base["rate"] == pytest.approx(30 / 61.0, abs=1e-3)  # baseline taken at t=5
    assert base["ttft_count"] == 30 and 90 <= base["ttft_mean_ms"] <= 110  # not 2 s: that was before
    # the router counts per engine: an adapter's requests count toward its base model, which names it
    assert "base-lora" not in now["models"] and base["adapters"] == ["base-lora"]
    other = now["models"]["other"]
    assert (other["requests"], other["errors"], other["error_share"]) == (4, 1, 0.25)
    assert 450 <= other["ttft_mean_ms"] <= 550 and other["ttft_p95_ms"] is not None


def test_a_young_window_says_its_age_and_a_new_or_restarted_endpoint_counts_whole() -> None:
    windows = ModelWindows(window=60, sample_every=5)
    a = Endpoint("http://a", ["m"])
    windows.update(fleet(a), now=0.0)
    windows.update(fleet(a), now=5.0)
    late = Endpoint("http://late", ["m"])  # listed after the baseline: its counters began then
    late.serve(6, ttft=0.2)
    a.serve(2, ttft=0.2)
    young = windows.update(fleet(a, late), now=10.0)
    assert young["covered_s"] == 10
    assert young["models"]["m"]["requests"] == 8
    restarted = Endpoint("http://a", ["m"])  # a counter that went backwards: the source restarted
    restarted.serve(1, ttft=0.2)
    after = windows.update(fleet(restarted, late), now=12.0)
    assert after["models"]["m"]["requests"] == 7


def test_an_idle_fleet_has_no_figures_and_clear_starts_afresh() -> None:
    windows = ModelWindows(window=60, sample_every=5)
    a = Endpoint("http://a", ["m"])
    a.serve(50, ttft=1.0)
    for t in (0.0, 0.5, 1.0):
        idle = windows.update(fleet(a), now=t)
    assert idle["covered_s"] == 0  # moves with samples, not with each read: an idle view pushes nothing
    m = idle["models"]["m"]
    assert m["requests"] == 0 and m["error_share"] is None and m["ttft_mean_ms"] is None
    windows.clear()
    assert windows.update(fleet(a), now=100.0)["covered_s"] == 0


def test_a_window_shorter_than_its_sampling_is_refused() -> None:
    with pytest.raises(ValueError, match="sample_every 10"):
        ModelWindows(window=5, sample_every=10)


@pytest.mark.parametrize("seed", range(20))
def test_a_window_counts_as_traffic_figures_minus_does(seed: int) -> None:
    """The window is taken on the router's raw bodies (no model per endpoint); it must agree with the
    one difference every other observer uses, restarts included."""
    rng = random.Random(seed)
    before, after = Endpoint("http://a", ["m"]), Endpoint("http://a", ["m"])
    before.serve(rng.randrange(0, 50), ttft=rng.uniform(0.001, 5.0), errors=0)
    after.requests, after.errors, after.ttfts = before.requests, before.errors, list(before.ttfts)
    if rng.random() < 0.2:
        after = Endpoint("http://a", ["m"])  # the counters started again
    for _ in range(rng.randrange(0, 5)):
        after.serve(rng.randrange(1, 20), ttft=rng.uniform(0.001, 5.0), errors=rng.randrange(0, 2))
    windows = ModelWindows(window=60, sample_every=5)
    windows.update(fleet(before), now=0.0)
    got = windows.update(fleet(after), now=30.0)["models"]["m"]
    want = TrafficFigures.model_validate(after.body()["traffic"]).minus(
        TrafficFigures.model_validate(before.body()["traffic"])
    )
    assert (got["requests"], got["errors"], got["ttft_count"]) == (
        want.requests,
        want.errors,
        want.ttft.count,
    )
    if want.ttft.count:
        assert got["ttft_mean_ms"] == pytest.approx(1000 * want.ttft.sum / want.ttft.count, abs=0.1)
        assert got["ttft_p95_ms"] == pytest.approx(1000 * (want.ttft.quantile(0.95) or 0), abs=0.1)


class Router:
    """What the router itself counted per model name (`/v1/fleet`'s `model_requests`): kept across
    every engine's departure, as a request is counted once the router has answered it."""

    def __init__(self) -> None:
        self.counted: dict[str, dict[str, int]] = {}

    def answered(self, model: str, n: int, errors: int = 0) -> None:
        counts = self.counted.setdefault(model, {"requests": 0, "errors": 0})
        counts["requests"] += n
        counts["errors"] += errors

    def view(self, *endpoints: Endpoint) -> dict[str, Any]:
        return {**fleet(*endpoints), "model_requests": {m: dict(c) for m, c in self.counted.items()}}


def test_a_models_figures_never_go_backwards_when_an_engine_leaves() -> None:
    """Issue 32: the model's request count dropped 121 → 105 as an engine was retired, and its req/s
    read 12-17 while 32 were sent: the figures were summed over the engines listed now, so a retired
    engine took its requests with it. They come from the router's own counting per model."""
    windows = ModelWindows(window=60, sample_every=5)
    router = Router()
    engines = [Endpoint(f"http://g{i}", ["m", "m-lora"], ["m-lora"]) for i in range(5)]
    windows.update(router.view(*engines[:2]), now=0.0)
    shown: list[int] = []
    totals: list[int] = []
    # a rollout under 32 req/s: every 15 s an old engine is retired and a new one takes its share
    for second in range(1, 76):
        live = engines[(second - 1) // 15 : (second - 1) // 15 + 2]
        for engine in live:
            engine.serve(16, ttft=0.05)
        router.answered("m", 30)
        router.answered("m-lora", 2)  # its adapter's requests count toward the base model
        figures = windows.update(router.view(*live), now=float(second))["models"]["m"]
        shown.append(figures["requests"])
        totals.append(figures["total"])
    assert totals == sorted(totals) and totals[-1] == 75 * 32  # never backwards, every request counted
    assert shown[:60] == sorted(shown[:60])  # the window fills without a dip as engines leave
    assert figures["rate"] == pytest.approx(32.0, rel=0.1)  # what was sent, not what the living engines saw
