"""The figures a traffic window is judged on beyond errors and TTFT (ITL p99, queue depth, KV cache
utilization, GPU memory): one rule, `max(baseline × ratio, baseline + slack)`, in the one comparison
every observer makes (`compare_windows`); a figure either side does not measure is not_measured and
named, never a pass; zero baselines, counters that restarted and values that are not numbers; and the
gauges as read from an engine's `/metrics` text."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.contracts.traffic import (
    FAILED,
    PASSED,
    LatencyHistogram,
    TrafficFigures,
    WindowSummary,
    WindowThresholds,
    compare_windows,
)
from corral.contracts.window_figures import GIB, GaugeReading, GaugeWindow, check_figure
from corral.engine.gauge_source import gauge_reading
from corral.engine.traffic_source import traffic_figures

LIMITS = WindowThresholds(min_requests=5)


def gauges(*readings: GaugeReading) -> GaugeWindow:
    window = GaugeWindow()
    for reading in readings:
        window.add(reading)
    return window


def summary(
    itl_s: float = 0.010,
    reading: GaugeReading | None = None,
    requests: int = 50,
    source: str = "engine_metrics",
) -> WindowSummary:
    figures = TrafficFigures(
        requests=requests,
        errors=0,
        ttft=LatencyHistogram.of_values([0.05] * requests),
        itl=LatencyHistogram.of_values([itl_s] * requests),
    )
    return WindowSummary.of(figures, 10.0, source, gauges(reading) if reading is not None else None)


HEALTHY = GaugeReading(waiting=2.0, kv_usage=0.30, gpu_memory_bytes=20 * GIB)


def by_figure(verdict: Any) -> dict[str, Any]:
    return {f.figure: f for f in verdict.figures}


def test_an_itl_five_times_the_baselines_fails_naming_the_figure_baseline_value_and_limit() -> None:
    verdict = compare_windows(summary(0.050, HEALTHY), summary(0.010, HEALTHY), LIMITS)
    assert verdict.verdict == FAILED
    itl = by_figure(verdict)["itl_p99_ms"]
    assert itl.outcome == "failed" and itl.baseline is not None and itl.observed is not None
    assert itl.observed > 4 * itl.baseline
    assert itl.limit == pytest.approx(max(2 * itl.baseline, itl.baseline + 25))
    assert "ITL p99" in verdict.reason and "max_itl_ratio" in verdict.reason
    assert f"{itl.observed:.4g} ms against {itl.baseline:.4g} ms for the baseline" in verdict.reason
    # the other figures were judged too, and passed
    assert {f: c.outcome for f, c in by_figure(verdict).items() if f != "itl_p99_ms"} == dict.fromkeys(
        ("queue_waiting", "kv_usage", "gpu_memory_gib"), "passed"
    )


@pytest.mark.parametrize(
    ("after", "figure", "words"),
    [
        (
            GaugeReading(waiting=12.0, kv_usage=0.30, gpu_memory_bytes=20 * GIB),
            "queue_waiting",
            "queue depth",
        ),
        (
            GaugeReading(waiting=2.0, kv_usage=0.60, gpu_memory_bytes=20 * GIB),
            "kv_usage",
            "KV cache utilization",
        ),
        (GaugeReading(waiting=2.0, kv_usage=0.30, gpu_memory_bytes=23 * GIB), "gpu_memory_gib", "GPU memory"),
    ],
)
def test_each_gauge_worse_than_its_limit_fails_by_name(after: GaugeReading, figure: str, words: str) -> None:
    verdict = compare_windows(summary(reading=after), summary(reading=HEALTHY), LIMITS)
    assert verdict.verdict == FAILED, verdict.reason
    assert [f.figure for f in verdict.figures if f.failed] == [figure]
    assert words in verdict.reason


def test_within_the_slack_of_a_zero_baseline_passes_and_beyond_it_fails() -> None:
    idle = GaugeReading(waiting=0.0, kv_usage=0.0, gpu_memory_bytes=0.0)
    small = GaugeReading(waiting=3.0, kv_usage=0.2, gpu_memory_bytes=0.5 * GIB)
    assert compare_windows(summary(0.004, small), summary(0.002, idle), LIMITS).verdict == PASSED
    big = GaugeReading(waiting=5.0, kv_usage=0.3, gpu_memory_bytes=2 * GIB)
    zero = summary(reading=idle).model_copy(update={"itl_p99_ms": 0.0})
    verdict = compare_windows(summary(0.040, big), zero, LIMITS)
    failed = {f.figure: f.limit for f in verdict.figures if f.failed}
    assert failed == {"itl_p99_ms": 25.0, "queue_waiting": 4.0, "kv_usage": 0.25, "gpu_memory_gib": 1.0}


def test_a_figure_not_measured_is_named_never_passed() -> None:
    cpu = GaugeWindow()
    cpu.add(GaugeReading(waiting=1.0, kv_usage=0.2))
    cpu.note("gpu_memory_gib", "the engine reports no GPU memory and NVML is not available here")
    window = WindowSummary.of(
        TrafficFigures(requests=50, errors=0, ttft=LatencyHistogram.of_values([0.05] * 50)), 10.0, "e", cpu
    )
    verdict = compare_windows(window, summary(reading=HEALTHY), LIMITS)
    assert verdict.verdict == PASSED  # nothing failed …
    outcomes = {f.figure: f.outcome for f in verdict.figures}
    assert outcomes["gpu_memory_gib"] == "not_measured" and outcomes["itl_p99_ms"] == "not_measured"
    assert (
        "GPU memory held (per engine, the window's highest) not measured: the engine reports no GPU memory"
        in verdict.reason
    )
    assert "ITL p99 not measured" in verdict.reason  # … and what was not judged is said


def test_a_source_without_gauges_and_a_baseline_without_them_say_so() -> None:
    router = summary(source="router")  # the router reads no gauges
    assert router.unmeasured["kv_usage"] == "the router source reads no gauges"
    verdict = compare_windows(summary(reading=HEALTHY), router, LIMITS)
    kv = by_figure(verdict)["kv_usage"]
    assert kv.outcome == "not_measured" and "the baseline's is not measured" in kv.reason
    older = WindowSummary.model_validate(
        {"source": "router", "seconds": 5, "requests": 40, "errors": 0, "error_ratio": 0.0}
    )  # a change record written before these figures
    kv = by_figure(compare_windows(summary(reading=HEALTHY), older, LIMITS))["kv_usage"]
    assert kv.outcome == "not_measured" and "the baseline has no kv_usage" in kv.reason
    alone = by_figure(compare_windows(summary(reading=HEALTHY), None, LIMITS))["queue_waiting"]
    assert alone.outcome == "not_measured" and "no baseline to compare with" in alone.reason


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_a_value_that_is_no_figure_is_not_measured(bad: float) -> None:
    rule = WindowThresholds().figure_rules()[1]
    for observed, baseline in ((bad, 1.0), (1.0, bad)):
        check = check_figure(rule, observed, baseline, "-", "-")
        assert check.outcome == "not_measured" and "not a figure" in check.reason, check


def test_a_restarted_engine_counts_its_whole_histogram_in_the_window() -> None:
    before = TrafficFigures(requests=900, errors=0, itl=LatencyHistogram.of_values([0.01] * 900))
    after = TrafficFigures(requests=40, errors=0, itl=LatencyHistogram.of_values([0.08] * 40))  # restarted
    window = WindowSummary.of(after.minus(before), 5.0, "engine_metrics", gauges(HEALTHY))
    assert window.requests == 40 and window.itl_p99_ms is not None and window.itl_p99_ms > 60
    verdict = compare_windows(window, summary(0.010, HEALTHY), LIMITS)
    assert by_figure(verdict)["itl_p99_ms"].failed


def test_a_gauge_window_keeps_the_mean_queue_and_kv_and_the_highest_memory() -> None:
    window = gauges(
        GaugeReading(waiting=0.0, kv_usage=0.1, gpu_memory_bytes=GIB),
        GaugeReading(waiting=4.0, kv_usage=None, gpu_memory_bytes=3 * GIB),
        GaugeReading(waiting=2.0, kv_usage=0.3, gpu_memory_bytes=2 * GIB),
    )
    assert (window.waiting, window.kv_usage, window.gpu_memory_gib, window.readings) == (2.0, 0.2, 3.0, 3)
    assert window.why_unmeasured() == {}
    assert GaugeWindow().why_unmeasured()["queue_waiting"] == "no gauge was read"
    group = GaugeReading.per_engine([GaugeReading(1.0, 0.2, GIB), GaugeReading(3.0, None, 4 * GIB)])
    assert group == GaugeReading(2.0, 0.2, 2.5 * GIB)  # the mean of each figure over the engines


@settings(deadline=None)
@given(
    baseline=st.floats(0, 1e4, allow_nan=False),
    observed=st.floats(0, 1e5, allow_nan=False),
    ratio=st.floats(1, 10),
    slack=st.floats(0, 100),
)
def test_the_rule_fails_exactly_above_the_higher_of_ratio_and_slack(
    baseline: float, observed: float, ratio: float, slack: float
) -> None:
    rule = WindowThresholds(max_queue_ratio=ratio, queue_slack=slack).figure_rules()[1]
    check = check_figure(rule, observed, baseline, "-", "-")
    assert check.failed == (observed > max(baseline * ratio, baseline + slack))
    if observed <= baseline:
        assert check.outcome == "passed"


METRICS = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 10
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.01",model_name="m"} 4
vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 0.3
"""


def test_the_gauges_and_itl_of_a_vllm_before_the_renames_are_read() -> None:
    assert gauge_reading(METRICS) == GaugeReading(waiting=5.0, kv_usage=0.5, gpu_memory_bytes=None)
    assert traffic_figures(METRICS).itl.count == 10
    current = METRICS.replace("gpu_cache_usage_perc", "kv_cache_usage_perc")
    current += 'vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 7\n'
    current += (
        'corral_sim_gpu_memory_bytes{kind="weights"} 1024\ncorral_sim_gpu_memory_bytes{kind="kv_cache"} 512\n'
    )
    assert gauge_reading(current) == GaugeReading(waiting=5.0, kv_usage=0.5, gpu_memory_bytes=1536.0)
    assert traffic_figures(current).itl.count == 7  # the current family wins where both are shown


@pytest.mark.parametrize(
    "text",
    [
        "vllm:num_requests_waiting{engine=0} 1\n",  # an unquoted label
        "vllm:kv_cache_usage_perc{} not-a-number\n",
        'vllm:num_requests_waiting{model_name="m"\n',
    ],
)
def test_text_that_is_not_prometheus_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        gauge_reading(text)
