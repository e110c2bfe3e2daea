"""The engine-side traffic source: `TrafficFigures` from a real vLLM `/metrics` capture and from
`corral sim`'s exposition (errors under finished_reason="error", data-parallel engines added up), a
window as the difference of two readings, and a first request's TTFT isolated between two readings."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from corral.contracts.traffic import WindowSummary
from corral.engine.traffic_source import ENGINE_METRICS, first_request_ttft_s, traffic_figures
from corral.sim.core.prefix_cache import PrefixCache
from corral.sim.core.scheduler import Scheduler
from corral.sim.core.stats import TTFT_BUCKETS, EngineStats
from corral.sim.http.metrics import EngineCollector

VLLM_METRICS = Path(__file__).parents[1] / "data" / "vllm-samples" / "metrics.body"


def sim_text(stats: EngineStats) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector("m", stats, Scheduler(8, 64, 16), PrefixCache(16, 64)))
    return generate_latest(registry).decode()


def test_the_real_vllm_capture_gives_its_requests_and_histograms_on_its_own_bounds() -> None:
    figures = traffic_figures(VLLM_METRICS.read_text())
    assert figures.requests == 5 and figures.errors == 0  # 5 finished with reason length, none error
    assert figures.ttft.bounds is not None and figures.ttft.bounds[:3] == [0.001, 0.005, 0.01]
    assert figures.ttft.count == 5 and figures.ttft.counts[:4] == [0, 3, 0, 2]
    assert figures.ttft.sum == pytest.approx(0.03618764877319336)
    assert figures.itl.count == 12 and figures.itl.bounds is not None and figures.itl.bounds[0] == 0.01
    summary = WindowSummary.of(figures, 10.0, ENGINE_METRICS)
    assert summary.error_ratio == 0.0
    assert summary.ttft_p50_ms is not None and 1.0 < summary.ttft_p50_ms <= 5.0
    assert summary.ttft_p99_ms is not None and 10.0 < summary.ttft_p99_ms <= 20.0


def test_sim_errors_count_and_a_window_is_the_difference_of_two_readings() -> None:
    stats = EngineStats()
    stats.success["stop"] = 40
    stats.ttft.observe(0.03, 40)
    stats.itl.observe(0.012, 400)
    before = traffic_figures(sim_text(stats))
    assert before.ttft.bounds == list(TTFT_BUCKETS)
    stats.success["stop"] += 70
    stats.success["error"] += 30
    stats.ttft.observe(0.3, 70)
    after = traffic_figures(sim_text(stats))
    window = after.minus(before)
    assert (window.requests, window.errors) == (100, 30)
    assert window.ttft.count == 70 and window.itl.count == 0
    summary = WindowSummary.of(window, 2.0, ENGINE_METRICS)
    assert summary.error_ratio == 0.3
    assert summary.ttft_p50_ms is not None and 250.0 < summary.ttft_p50_ms <= 500.0


def test_data_parallel_engines_and_models_are_added_up() -> None:
    lines = []
    for engine, reason, n in (("0", "stop", 3), ("1", "stop", 4), ("1", "error", 2)):
        lines.append(
            f'vllm:request_success_total{{engine="{engine}",finished_reason="{reason}",model_name="m"}} {n}'
        )
    for engine, counts in (("0", (1, 3)), ("1", (2, 4))):
        for le, c in zip(("0.1", "+Inf"), counts, strict=True):
            lines.append(
                f'vllm:time_to_first_token_seconds_bucket{{engine="{engine}",le="{le}",model_name="m"}} {c}'
            )
        lines.append(f'vllm:time_to_first_token_seconds_sum{{engine="{engine}",model_name="m"}} 1.5')
    figures = traffic_figures("\n".join(lines) + "\n")
    assert (figures.requests, figures.errors) == (9, 2)
    assert figures.ttft.bounds == [0.1] and figures.ttft.counts == [3, 4] and figures.ttft.sum == 3.0


def test_series_on_different_bounds_and_text_that_is_not_prometheus_are_refused() -> None:
    mixed = (
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="0.2"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"} 1\n'
    )
    with pytest.raises(ValueError, match="different bucket bounds"):
        traffic_figures(mixed)
    with pytest.raises(ValueError):
        traffic_figures("<html>not metrics</html>\n")


def test_a_first_request_ttft_is_the_growth_of_the_sum_when_exactly_one_request_came() -> None:
    stats = EngineStats()
    stats.ttft.observe(0.02, 5)
    before = traffic_figures(sim_text(stats))
    stats.ttft.observe(0.75)
    one = traffic_figures(sim_text(stats))
    assert first_request_ttft_s(before, one) == pytest.approx(0.75)
    stats.ttft.observe(0.02)
    assert first_request_ttft_s(before, traffic_figures(sim_text(stats))) is None  # two: not told apart
    assert first_request_ttft_s(one, one) is None
