"""The rollout canary's window and verdict (fleet/rollout/canary.py): per-group windows from two
/v1/fleet listings, an early stop on a failed verdict, inconclusive never reading as passed, the ITL
the router measured judged, and both groups' gauges read from the engines' own /metrics (per engine,
so groups of any size compare; GPU memory, which a vLLM does not show there, not measured)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from corral.contracts.router import FleetEndpoint
from corral.contracts.traffic import LatencyHistogram, TrafficFigures, WindowThresholds
from corral.contracts.window_figures import GaugeWindow
from corral.engine.gauge_source import sample_engines
from corral.fleet.rollout.canary import CanaryBlind, CanarySettings, failure, judge, watch, window_of
from tests.support.procs import free_port

NEW, OLD = "http://new:1", "http://old:1"


def figures(requests: int, errors: int, ttft_s: float = 0.02) -> TrafficFigures:
    return TrafficFigures(
        requests=requests, errors=errors, ttft=LatencyHistogram.of_values([ttft_s] * requests)
    )


def listing(**by_url: TrafficFigures | None) -> dict[str, FleetEndpoint]:
    urls = {"new": NEW, "old": OLD, "new2": "http://new:2"}
    return {urls[k]: FleetEndpoint(url=urls[k], routable=True, traffic=v) for k, v in by_url.items()}


def test_a_window_is_the_difference_of_two_listings_summed_over_the_group() -> None:
    start = listing(new=figures(2, 0), new2=figures(1, 0), old=figures(100, 1))
    end = listing(new=figures(12, 3), new2=figures(6, 1), old=figures(150, 2))
    window = window_of(start, end, [NEW, "http://new:2"])
    assert window is not None and (window.requests, window.errors) == (15, 4)
    assert window.ttft.count == 15
    old = window_of(start, end, [OLD])
    assert old is not None and (old.requests, old.errors) == (50, 1)


def test_an_engine_that_joined_inside_the_window_counts_whole_and_one_gone_counts_nothing() -> None:
    start = listing(old=figures(10, 0))
    end = listing(new=figures(7, 2))
    joined = window_of(start, end, [NEW])
    assert joined is not None and joined.requests == 7
    assert window_of(start, end, [OLD]) is None


def test_a_router_without_per_endpoint_traffic_is_named_with_what_to_do() -> None:
    with pytest.raises(CanaryBlind, match="--canary-seconds 0"):
        window_of({}, listing(new=None), [NEW])


def test_twenty_percent_errors_against_a_clean_baseline_fails_naming_the_ratio() -> None:
    verdict = judge(figures(50, 10), figures(200, 0), 5.0, WindowThresholds())
    assert verdict.verdict == "failed"
    assert "error ratio 0.200 (10/50)" in verdict.reason
    why = failure(verdict, "g0'", CanarySettings(5.0))
    assert why is not None and why.startswith("canary failed") and "g0'" in why and "0.200" in why


def test_a_healthy_group_passes_and_a_slow_one_fails_on_ttft() -> None:
    assert judge(figures(50, 0), figures(200, 0), 5.0, WindowThresholds()).verdict == "passed"
    slow = judge(figures(50, 0, ttft_s=0.5), figures(200, 0, ttft_s=0.02), 5.0, WindowThresholds())
    assert slow.verdict == "failed" and "TTFT p99" in slow.reason


def test_too_little_traffic_is_inconclusive_and_stops_the_rollout_unless_accepted() -> None:
    quiet = judge(figures(3, 0), figures(200, 0), 5.0, WindowThresholds())
    assert quiet.verdict == "inconclusive"
    why = failure(quiet, "g0'", CanarySettings(5.0))
    assert why is not None and "--canary-min-requests 0" in why and "3 requests" in why
    accepted = judge(figures(0, 0), figures(0, 0), 5.0, WindowThresholds(min_requests=0))
    assert accepted.verdict == "passed" and failure(accepted, "g0'", CanarySettings(5.0)) is None


def test_without_old_groups_the_new_one_is_held_to_the_error_ratio_alone() -> None:
    assert judge(figures(50, 1), None, 5.0, WindowThresholds()).verdict == "passed"
    assert judge(figures(50, 10), None, 5.0, WindowThresholds()).verdict == "failed"


class Scripted:
    """Listings a router would give, one per call, the last repeated."""

    def __init__(self, listings: list[dict[str, FleetEndpoint]]) -> None:
        self.listings, self.calls = listings, 0

    async def __call__(self) -> dict[str, FleetEndpoint]:
        self.calls += 1
        return self.listings[min(self.calls, len(self.listings)) - 1]


async def test_the_watch_stops_at_the_first_failed_verdict() -> None:
    script = Scripted(
        [
            listing(new=figures(0, 0), old=figures(0, 0)),
            listing(new=figures(5, 1), old=figures(20, 0)),  # too few to judge yet
            listing(new=figures(30, 6), old=figures(120, 0)),  # failed: stops here
            listing(new=figures(60, 12), old=figures(240, 0)),
        ]
    )
    settings = CanarySettings(seconds=60.0, check_seconds=0.01)
    verdict = await watch(script, [NEW], [OLD], settings)
    assert verdict.verdict == "failed" and script.calls == 3
    assert verdict.window.requests == 30 and verdict.baseline is not None and verdict.baseline.requests == 120


async def test_the_watch_runs_its_whole_window_when_nothing_fails() -> None:
    script = Scripted(
        [listing(new=figures(0, 0), old=figures(0, 0)), listing(new=figures(40, 0), old=figures(90, 0))]
    )
    verdict = await watch(script, [NEW], [OLD], CanarySettings(seconds=0.05, check_seconds=0.01))
    assert verdict.verdict == "passed" and verdict.window.requests == 40 and script.calls >= 2


def test_settings_refuse_a_negative_window() -> None:
    with pytest.raises(ValueError, match="canary seconds"):
        CanarySettings(-1.0)


def test_the_canary_judges_the_itl_the_router_measured() -> None:
    def timed(itl_s: float) -> TrafficFigures:
        return figures(50, 0).model_copy(update={"itl": LatencyHistogram.of_values([itl_s] * 50)})

    verdict = judge(timed(0.100), timed(0.020), 5.0, WindowThresholds())
    assert verdict.verdict == "failed" and "ITL p99" in verdict.reason, verdict.reason
    why = failure(verdict, "g0'", CanarySettings(5.0))
    assert why is not None and "ITL p99" in why and "for the baseline" in why
    gauges = {f.figure: f.outcome for f in verdict.figures if f.figure != "itl_p99_ms"}
    assert set(gauges.values()) == {"not_measured"}  # no sampler: said, never passed


class Gauges:
    """An engine's /metrics with a queue and a KV utilization, over real HTTP on loopback."""

    def __init__(self, waiting: float, kv_usage: float) -> None:
        self.text = (
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}\n'
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv_usage}\n'
        )

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=self.text)


@pytest.fixture
async def engines() -> AsyncIterator[Callable[[Gauges], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(engine: Gauges) -> str:
        app = web.Application()
        app.router.add_get("/metrics", engine.metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_the_watch_reads_both_groups_gauges_and_fails_a_new_group_whose_kv_cache_fills(
    engines: Callable[[Gauges], Awaitable[str]],
) -> None:
    new = await engines(Gauges(waiting=0, kv_usage=0.9))
    old = [await engines(Gauges(waiting=0, kv_usage=0.2)), await engines(Gauges(waiting=2, kv_usage=0.3))]
    gone = f"http://127.0.0.1:{free_port()}"  # an old engine that no longer answers

    def by(requests: int) -> dict[str, FleetEndpoint]:
        return {
            url: FleetEndpoint(url=url, routable=True, traffic=figures(requests, 0)) for url in (new, *old)
        }

    script = Scripted([by(0), by(40)])
    async with aiohttp.ClientSession() as session:
        sample = functools.partial(sample_engines, session)
        settings = CanarySettings(seconds=0.05, check_seconds=0.01)
        verdict = await watch(script, [new], [*old, gone], settings, sample)
    checks = {f.figure: f for f in verdict.figures}
    kv = checks["kv_usage"]
    assert verdict.verdict == "failed" and kv.failed and "KV cache utilization" in verdict.reason, verdict
    assert (kv.observed, kv.baseline) == (0.9, 0.25)  # the old engines' mean: groups of any size compare
    assert checks["queue_waiting"].outcome == "passed" and checks["queue_waiting"].baseline == 1.0
    memory = checks["gpu_memory_gib"]
    assert memory.outcome == "not_measured" and "NVML" in memory.reason, memory  # a vLLM shows none
    assert verdict.baseline is not None and verdict.baseline.gauge_readings >= 1


async def test_gpu_memory_a_vllm_does_not_show_comes_from_its_supervisors_reading(
    engines: Callable[[Gauges], Awaitable[str]],
) -> None:
    """The rollout hands the canary each engine's memory as its supervisor measured it (NVML): a new
    engine holding 30 GiB where the old hold 20 fails on GPU memory; an engine without a figure is
    named, and the group is judged on the engines that have one."""
    new = await engines(Gauges(waiting=0, kv_usage=0.2))
    old = [await engines(Gauges(waiting=0, kv_usage=0.2)), await engines(Gauges(waiting=0, kv_usage=0.2))]
    memory: dict[str, float | str] = {
        new: 30.0 * 2**30,
        old[0]: 20.0 * 2**30,
        old[1]: "its supervisor: no memory verdict yet",
    }

    def by(requests: int) -> dict[str, FleetEndpoint]:
        return {
            url: FleetEndpoint(url=url, routable=True, traffic=figures(requests, 0)) for url in (new, *old)
        }

    async with aiohttp.ClientSession() as session:
        sample = functools.partial(sample_engines, session, memory=memory)
        settings = CanarySettings(seconds=0.05, check_seconds=0.01)
        verdict = await watch(Scripted([by(0), by(40)]), [new], old, settings, sample)
        alone = GaugeWindow()
        await sample_engines(session, [old[1]], alone, memory=memory)
    gpu = next(f for f in verdict.figures if f.figure == "gpu_memory_gib")
    assert verdict.verdict == "failed" and gpu.failed and (gpu.observed, gpu.baseline) == (30.0, 20.0), gpu
    assert "GPU memory held" in verdict.reason
    assert alone.why_unmeasured()["gpu_memory_gib"] == f"{old[1]}: its supervisor: no memory verdict yet"
