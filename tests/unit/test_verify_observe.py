"""`corral verify --observe-seconds`'s window assembly and judgement: the fleet's window is each
endpoint's later reading less its earlier one, summed; one bad engine in a big fleet is named even when
the fleet passes; too few requests warn; an older router's fleet (no `traffic`) is NOT MEASURED; the
baseline is the newest record's steady window; `latency` compares steady state when there is a window
and says it compared one probe when there is none; memory is compared with the last record's; the
engines' gauges over the window, each endpoint's against the fleet's per engine."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from corral.contracts.router import FleetEndpoint, RouterFleet
from corral.contracts.traffic import (
    LatencyHistogram,
    RequestCounts,
    TrafficFigures,
    WindowSummary,
    WindowThresholds,
)
from corral.contracts.window_figures import GaugeReading, GaugeWindow
from corral.engine.gauge_source import add_group
from corral.fleet.checks.observe import (
    FleetGauges,
    ObservedWindow,
    judge,
    last_steady,
    warmup_ttft_ms,
    window_between,
    with_supervisor_memory,
)
from corral.fleet.checks.probe import EngineView
from corral.fleet.checks.verify import (
    FAIL,
    NOT_MEASURED,
    PASS,
    WARN,
    Check,
    Observation,
    SteadyBaseline,
    check_latency,
)
from corral.fleet.checks.verify_memory import memory_deltas
from tests.support.procs import free_port

ROUTER = "http://router"
LIMITS = WindowThresholds()


def figures(
    requests: int, errors: int | None = 0, ttft_s: float = 0.01, warmup_s: float | None = None
) -> TrafficFigures:
    return TrafficFigures(
        requests=requests,
        errors=errors,
        ttft=LatencyHistogram.of_values([ttft_s] * requests),
        itl=LatencyHistogram.of_values([0.005] * requests),
        warmup_ttft_s=warmup_s,
    )


def fleet(traffic: dict[str, TrafficFigures | None], totals: RequestCounts | None = None) -> RouterFleet:
    endpoints = [FleetEndpoint(url=url, routable=True, traffic=t) for url, t in traffic.items()]
    return RouterFleet(endpoints=endpoints, totals=totals)


def test_the_window_is_each_endpoints_difference_summed_and_a_new_endpoint_counts_whole() -> None:
    before = fleet(
        {"http://a": figures(100, 1), "http://b": figures(50)}, RequestCounts(requests=150, errors=1)
    )
    after = fleet(
        {"http://a": figures(160, 4), "http://b": figures(90), "http://c": figures(10, 0, 0.5)},
        RequestCounts(requests=260, errors=4, stream_failures=1),
    )
    window = window_between(before, after, 3.0, ROUTER)
    assert window.fleet is not None and window.why_not == ""
    assert (window.fleet.requests, window.fleet.errors) == (60 + 40 + 10, 3)
    assert {url: w.requests for url, w in window.endpoints.items()} == {
        "http://a": 60,
        "http://b": 40,
        "http://c": 10,
    }
    assert window.endpoints["http://a"].error_ratio == 0.05
    assert (
        window.fleet.ttft_p99_ms is not None and window.fleet.ttft_p99_ms > 100
    )  # c's 0.5 s is in the window
    failures = window.request_failures
    assert failures is not None and failures.source == ROUTER
    assert failures.during == RequestCounts(requests=110, errors=3, stream_failures=1)


def test_a_router_without_traffic_figures_is_not_measured_and_named() -> None:
    old = fleet({"http://a": None, "http://b": None})
    window = window_between(old, old, 3.0, ROUTER)
    assert window.fleet is None and window.request_failures is None
    assert "no per-endpoint traffic figures" in window.why_not and ROUTER in window.why_not
    judged = judge(window, None, LIMITS, {})
    assert judged.check.verdict == NOT_MEASURED and judged.check.detail == window.why_not
    assert judge(window, None, LIMITS, {}, require_measured=True).check.verdict == FAIL


def big_fleet(bad_errors: int) -> ObservedWindow:
    """Ten engines, 100 requests each in the window; engine-3 failed `bad_errors` of its own."""
    urls = [f"http://e{i}" for i in range(10)]
    before = fleet({url: figures(0) for url in urls})
    after = fleet({url: figures(100, bad_errors if url == "http://e3" else 0) for url in urls})
    return window_between(before, after, 5.0, ROUTER)


def test_one_bad_engine_in_a_big_fleet_is_named_though_the_fleet_passes() -> None:
    names = {f"http://e{i}": f"engine-{i}" for i in range(10)}
    window = big_fleet(bad_errors=40)
    assert window.fleet is not None and window.fleet.error_ratio == 0.04  # within the fleet's 0.05
    judged = judge(window, None, LIMITS, names)
    assert judged.verdict is not None and judged.verdict.verdict == "passed"
    assert judged.check.verdict == FAIL, judged.check
    assert "engine-3: error ratio 0.400 (40/100)" in judged.check.detail
    assert [n for n, v in judged.endpoints.items() if v.verdict == "failed"] == ["engine-3"]
    assert judged.endpoints["engine-0"].baseline is None  # the fleet's window is kept once, as steady

    healthy = judge(big_fleet(bad_errors=0), None, LIMITS, names)
    assert healthy.check.verdict == PASS, healthy.check
    assert "1000 requests" in healthy.check.detail and "no endpoint worse" in healthy.check.detail


def test_too_few_requests_warn_and_fail_only_when_measurement_is_required() -> None:
    window = window_between(fleet({"http://a": figures(0)}), fleet({"http://a": figures(5)}), 3.0, ROUTER)
    assert judge(window, None, LIMITS, {}).check.verdict == WARN
    assert judge(window, None, LIMITS, {}, require_measured=True).check.verdict == FAIL


def test_the_fleet_fails_against_the_baseline_naming_both_figures() -> None:
    baseline_window = window_between(
        fleet({"http://a": figures(0)}), fleet({"http://a": figures(100)}), 3.0, ROUTER
    )
    assert baseline_window.fleet is not None
    baseline = SteadyBaseline(baseline_window.fleet, "verify /state/verify-8000.json")
    slow = window_between(
        fleet({"http://a": figures(0)}), fleet({"http://a": figures(100, 0, 0.5)}), 3.0, ROUTER
    )
    judged = judge(slow, baseline, LIMITS, {})
    assert judged.check.verdict == FAIL
    assert (
        judged.check.detail.startswith("fleet: TTFT p99") and "baseline: verify /state" in judged.check.detail
    )
    record = judged.latency({"engine-0": 12.0})
    assert record.steady == slow.fleet and record.baseline == baseline.summary
    assert record.verdict is not None and record.verdict.verdict == "failed"
    assert record.warmup_ttft_ms == {"engine-0": 12.0}


def steady_record(kind: str, finished: float, p99: float | None, router: str = ROUTER) -> dict[str, Any]:
    steady = (
        None
        if p99 is None
        else {
            "source": "router",
            "seconds": 3,
            "requests": 50,
            "errors": 0,
            "error_ratio": 0.0,
            "ttft_p99_ms": p99,
        }
    )
    return {"kind": kind, "finished": finished, "router": router, "latency": {"steady": steady}}


def test_the_baseline_is_the_newest_record_with_a_steady_window_of_this_router() -> None:
    records = [
        ("verify.json", steady_record("verify", 100.0, 10.0)),
        ("rollout.json", steady_record("rollout", 200.0, 20.0)),
        ("rollback.json", steady_record("rollback", 300.0, None)),  # newest, but no window
        ("other.json", steady_record("verify", 400.0, 40.0, router="http://another-router")),
        ("missing.json", None),
    ]
    found = last_steady(records, ROUTER)
    assert found is not None and found.summary.ttft_p99_ms == 20.0 and found.source == "rollout rollout.json"
    assert last_steady([("old.json", {"kind": "verify", "finished": 1.0, "ttft_ms": 3.0})], ROUTER) is None


def test_latency_compares_steady_state_when_observed_and_says_one_probe_otherwise() -> None:
    window = window_between(
        fleet({"http://a": figures(0)}), fleet({"http://a": figures(100, 0, 0.02)}), 3.0, ROUTER
    )
    assert window.fleet is not None
    base_window = window_between(
        fleet({"http://a": figures(0)}), fleet({"http://a": figures(100, 0, 0.01)}), 3.0, ROUTER
    )
    assert base_window.fleet is not None
    observed = Observation(
        Check("traffic", PASS, ""), window.fleet, SteadyBaseline(base_window.fleet, "verify v.json")
    )
    check = check_latency(99.0, {"ttft_ms": 1.0}, observed)
    assert check.verdict == PASS and check.detail.startswith("steady TTFT p99")
    assert "in verify v.json" in check.detail and "99.0" not in check.detail  # the probe is not compared

    probe = check_latency(5.0, {"ttft_ms": 4.0})
    assert "one probe request, not steady state" in probe.detail and "last record's 4.0 ms" in probe.detail
    worse = check_latency(500.0, {"ttft_ms": 4.0})
    assert worse.verdict == WARN  # reported, never failed on


def test_warmup_ttft_is_each_endpoints_first_request_by_engine_name() -> None:
    endpoints = [
        FleetEndpoint(url="http://a", traffic=figures(3, warmup_s=0.0421)),
        FleetEndpoint(url="http://b", traffic=figures(3)),  # has not served since it became routable
        FleetEndpoint(url="http://c"),  # an older router
    ]
    assert warmup_ttft_ms(endpoints, {"http://a": "engine-0"}) == {"engine-0": 42.1}


def sim_engine(name: str, weights: int, kv: int) -> EngineView:
    metrics = (
        f'corral_sim_gpu_memory_bytes{{kind="weights"}} {weights}\n'
        f'corral_sim_gpu_memory_bytes{{kind="kv_cache"}} {kv}\n'
    )
    return EngineView(name, f"http://{name}-sup", f"http://{name}", metrics=metrics)


def test_memory_is_now_against_the_last_records_figure_per_engine() -> None:
    previous = {"memory": [{"engine": "engine-0", "source": "engine_metrics", "after_bytes": 1000}]}
    nvml = EngineView(
        "engine-2",
        "http://e2-sup",
        "http://e2",
        state={"memory": {"last": {"operation": "wake", "source": "nvml", "after": {"total_bytes": 7}}}},
    )
    silent = EngineView("engine-3", "http://e3-sup", "http://e3", state={"memory": {"last": None}})
    deltas, why = memory_deltas(
        [sim_engine("engine-0", 1200, 300), sim_engine("engine-1", 5, 5), nvml, silent], previous
    )
    assert why == ""
    by_engine = {d.engine: d for d in deltas}
    assert set(by_engine) == {"engine-0", "engine-1", "engine-2"}  # engine-3: nothing to read
    assert (by_engine["engine-0"].before_bytes, by_engine["engine-0"].after_bytes) == (1000, 1500)
    assert by_engine["engine-0"].delta_bytes == 500
    assert by_engine["engine-1"].delta_bytes is None  # no earlier figure: no made-up zero
    assert (by_engine["engine-2"].source, by_engine["engine-2"].after_bytes) == ("nvml", 7)
    none, why = memory_deltas([silent], previous)
    assert none == [] and "no engine reports its memory" in why


def answering(text: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=text)

    return metrics


async def test_one_engine_whose_queue_grows_is_named_against_the_fleets_gauges() -> None:
    """The engines' gauges read from their own /metrics over real HTTP (one stopped engine noted, not
    fatal); each endpoint is judged against the fleet's per-engine figures, the fleet against a
    baseline from a record written before these figures (not measured, and said)."""
    texts = {"e0": 0.0, "e1": 0.0, "e2": 9.0}  # e2's queue
    runners, urls = [], {}
    for name, waiting in texts.items():
        app = web.Application()
        body = (
            f'vllm:num_requests_waiting{{engine="0"}} {waiting}\nvllm:kv_cache_usage_perc{{engine="0"}} 0.1\n'
        )
        app.router.add_get("/metrics", answering(body))
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        urls[name] = f"http://127.0.0.1:{runner.addresses[0][1]}"
    stopped = f"http://127.0.0.1:{free_port()}"
    gauges = FleetGauges()
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                await gauges.sample(session, [*urls.values(), stopped])
    finally:
        for runner in runners:
            await runner.cleanup()
    assert gauges.fleet.waiting == 3.0 and gauges.fleet.readings == 2  # per engine: (0 + 0 + 9) / 3
    assert stopped in gauges.endpoints[stopped].why_unmeasured()["queue_waiting"]
    before = fleet({url: figures(0) for url in [*urls.values(), stopped]})
    after = fleet({url: figures(100) for url in [*urls.values(), stopped]})
    window = window_between(before, after, 5.0, ROUTER, gauges)
    names = {url: name for name, url in urls.items()}
    older = WindowSummary(source="router", seconds=5, requests=300, errors=0, error_ratio=0.0)
    judged = judge(window, SteadyBaseline(older, "verify /state/verify-8000.json"), LIMITS, names)
    assert judged.check.verdict == FAIL, judged.check
    assert "e2: queue depth" in judged.check.detail and "e0" not in judged.check.detail, judged.check.detail
    assert judged.verdict is not None
    fleet_queue = next(f for f in judged.verdict.figures if f.figure == "queue_waiting")
    assert fleet_queue.outcome == "not_measured" and "the baseline has no queue_waiting" in fleet_queue.reason
    memory = next(f for f in judged.endpoints["e0"].figures if f.figure == "gpu_memory_gib")
    assert memory.outcome == "not_measured" and "NVML" in memory.reason


def nvml_state(held_gib: float) -> dict[str, Any]:
    reading = {"source": "nvml", "total_bytes": int(held_gib * 2**30)}
    last = {"operation": "ready", "outcome": "passed", "source": "nvml", "reading": reading}
    return {"memory": {"last": last}}


def test_a_real_vllms_gpu_memory_is_its_supervisors_reading_judged_with_the_window() -> None:
    """vLLM shows no memory in /metrics: verify takes each engine's from its supervisor (NVML), the
    fleet's their mean; one engine holding far more than the others is named; an engine whose
    supervisor has no figure says why, never passed."""
    urls = ["http://e0", "http://e1", "http://e2", "http://e3"]
    gauges = FleetGauges()
    for url in urls:  # what a vLLM's /metrics gives: a queue and a KV utilization, no memory
        add_group(gauges.endpoints.setdefault(url, GaugeWindow()), {url: GaugeReading(0.0, 0.1)})
    add_group(gauges.fleet, {url: GaugeReading(0.0, 0.1) for url in urls})
    before, after = fleet(dict.fromkeys(urls, figures(0))), fleet(dict.fromkeys(urls, figures(100)))
    window = window_between(before, after, 5.0, ROUTER, gauges)
    assert window.fleet is not None and window.fleet.gpu_memory_gib is None
    engines = {
        f"http://e{i}": EngineView(f"e{i}", f"http://s{i}", f"http://e{i}", state=state)
        for i, state in enumerate(
            [nvml_state(20), nvml_state(20), nvml_state(32), {"memory": {"last": None}}]
        )
    }
    filled = with_supervisor_memory(window, engines)
    assert filled.fleet is not None and filled.fleet.gpu_memory_gib == 24.0  # (20 + 20 + 32) / 3
    held = {u: s.gpu_memory_gib for u, s in filled.endpoints.items()}
    assert held == {"http://e0": 20.0, "http://e1": 20.0, "http://e2": 32.0, "http://e3": None}
    assert (
        filled.endpoints["http://e3"].unmeasured["gpu_memory_gib"] == "its supervisor: no memory verdict yet"
    )
    baseline = filled.fleet.model_copy(update={"gpu_memory_gib": 20.0})  # the last record's steady window
    judged = judge(filled, SteadyBaseline(baseline, "verify /state/verify-8000.json"), LIMITS, {})
    detail = judged.check.detail
    assert judged.check.verdict == FAIL and "fleet: GPU memory held" in detail and "24 GiB" in detail, detail
    assert "http://e2: GPU memory held (per engine, the window's highest) 32 GiB" in detail, detail
    e3 = next(f for f in judged.endpoints["http://e3"].figures if f.figure == "gpu_memory_gib")
    assert e3.outcome == "not_measured" and "no memory verdict yet" in e3.reason
