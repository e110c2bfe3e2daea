"""The rollout canary's window and verdict (fleet/rollout/canary.py): per-group windows from two
/v1/fleet listings, an early stop on a failed verdict, and inconclusive never reading as passed."""

from __future__ import annotations

import pytest

from corral.contracts.router import FleetEndpoint
from corral.contracts.traffic import LatencyHistogram, TrafficFigures, WindowThresholds
from corral.fleet.rollout.canary import CanaryBlind, CanarySettings, failure, judge, watch, window_of

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
