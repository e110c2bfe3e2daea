"""The traffic-window contract: histogram windows, quantiles, and the one comparison every observer
of a change (canary, OBSERVE, verify) makes."""

from __future__ import annotations

import itertools

import pytest

from corral.contracts.traffic import (
    FAILED,
    INCONCLUSIVE,
    LATENCY_BOUNDS,
    PASSED,
    LatencyHistogram,
    TrafficFigures,
    WindowSummary,
    WindowThresholds,
    compare_windows,
    summed,
    windows_between,
)
from corral.router.telemetry.metrics import TTFT_BUCKETS


def test_the_bounds_are_fine_and_hold_every_coarse_router_bucket() -> None:
    assert list(LATENCY_BOUNDS) == sorted(set(LATENCY_BOUNDS))
    ratios = [b / a for a, b in itertools.pairwise(LATENCY_BOUNDS)]
    assert max(ratios) < 2.6  # only the last, 120 s → 300 s
    assert max(ratios[:-1]) <= 1.34
    assert set(TTFT_BUCKETS) <= set(LATENCY_BOUNDS)


def test_quantiles_land_within_a_bucket_of_the_truth() -> None:
    values = [0.010 + 0.001 * i for i in range(100)]  # 10 ms … 109 ms
    hist = LatencyHistogram.of_values(values)
    assert hist.count == 100
    p50, p99 = hist.quantile(0.5), hist.quantile(0.99)
    assert p50 is not None and p99 is not None
    assert 0.059 / 1.34 <= p50 <= 0.060 * 1.34
    assert 0.108 / 1.34 <= p99 <= 0.109 * 1.34
    assert LatencyHistogram().quantile(0.99) is None


def test_a_window_is_the_difference_of_two_readings() -> None:
    early = TrafficFigures(requests=10, errors=1, ttft=LatencyHistogram.of_values([0.01] * 10))
    late = TrafficFigures(requests=30, errors=6, ttft=LatencyHistogram.of_values([0.01] * 10 + [0.5] * 20))
    window = late.minus(early)
    assert (window.requests, window.errors, window.ttft.count) == (20, 5, 20)
    assert window.ttft.quantile(0.5) == pytest.approx(0.5, rel=0.34)
    # a source that restarted (its counters went back) gives its whole reading, never negatives
    assert early.minus(late) == early


def test_engine_histograms_on_their_own_bounds_read_the_same_way() -> None:
    hist = LatencyHistogram.from_cumulative([0.1, 0.5, 1.0], [2, 8, 10, 10], 4.2)
    assert hist.counts == [2, 6, 2]
    assert hist.quantile(0.5) == pytest.approx(0.1 + 0.4 * (3 / 6))
    with pytest.raises(ValueError, match="different bucket bounds"):
        hist.minus(LatencyHistogram())


def _summary(requests: int, errors: int | None, ttft_ms: float) -> WindowSummary:
    figures = TrafficFigures(
        requests=requests, errors=errors, ttft=LatencyHistogram.of_values([ttft_ms / 1000] * requests)
    )
    return WindowSummary.of(figures, 10.0, "router")


def test_a_window_with_a_fifth_of_its_requests_failing_fails_and_says_why() -> None:
    verdict = compare_windows(_summary(50, 10, 20), _summary(200, 0, 20), WindowThresholds())
    assert verdict.verdict == FAILED
    assert "error ratio 0.200 (10/50)" in verdict.reason


def test_a_slower_window_fails_only_beyond_ratio_and_slack() -> None:
    limits = WindowThresholds(max_ttft_ratio=2.0, ttft_slack_ms=50)
    assert compare_windows(_summary(50, 0, 500), _summary(50, 0, 100), limits).verdict == FAILED
    # three times slower, but only 10 ms worse: within the slack
    assert compare_windows(_summary(50, 0, 15), _summary(50, 0, 5), limits).verdict == PASSED


def test_too_few_requests_is_inconclusive_and_no_baseline_holds_errors_alone() -> None:
    assert compare_windows(_summary(5, 5, 10), None, WindowThresholds()).verdict == INCONCLUSIVE
    assert compare_windows(_summary(40, 0, 10), None, WindowThresholds()).verdict == PASSED
    assert compare_windows(_summary(40, 20, 10), None, WindowThresholds()).verdict == FAILED
    unmeasured = compare_windows(_summary(40, None, 10), None, WindowThresholds())
    assert unmeasured.verdict == PASSED and "not measured" in unmeasured.reason


def test_windows_between_readings_count_a_newcomer_whole_and_a_leaver_not_at_all() -> None:
    one = TrafficFigures(requests=10, errors=0, ttft=LatencyHistogram.of_values([0.01] * 10))
    two = TrafficFigures(requests=25, errors=5, ttft=LatencyHistogram.of_values([0.01] * 25))
    earlier = {"a": one, "gone": one}
    later = {"a": two, "new": one}
    windows = windows_between(earlier, later)
    assert set(windows) == {"a", "new"}
    assert (windows["a"].requests, windows["a"].errors) == (15, 5)
    assert windows["new"] == one
    total = summed(windows.values())
    assert total is not None and (total.requests, total.errors, total.ttft.count) == (25, 5, 25)
    assert summed([]) is None
