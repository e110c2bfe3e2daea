"""`corral load`'s pieces that need no network: the streamed share spread over the requests, the
quantiles, and the lines it prints."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.fleet.load.driver import LoadPlan
from corral.fleet.load.tally import LoadTally, RequestOutcome, quantile


@settings(deadline=None)
@given(share=st.floats(0.0, 1.0), start=st.integers(0, 10_000), count=st.integers(0, 2_000))
def test_any_run_of_requests_streams_its_share_within_one(share: float, start: int, count: int) -> None:
    plan = LoadPlan(
        url="http://127.0.0.1:1", model="m", seconds=1, max_requests=1, stream_share=share, rate=1
    )
    streamed = sum(plan.streamed(n) for n in range(start, start + count))
    assert abs(streamed - share * count) <= 1


def test_quantile_is_nearest_rank_and_nan_when_empty() -> None:
    assert math.isnan(quantile([], 0.5))
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.5) == 50.0 and quantile(values, 0.99) == 99.0 and quantile([3.0], 0.99) == 3.0


def test_the_summary_counts_each_failure_by_kind() -> None:
    tally = LoadTally()
    for failure in (None, None, "HTTP 503", "stream cut", "HTTP 503"):
        tally.started(streamed=failure == "stream cut")
        tally.ended(RequestOutcome(0.010, failure == "stream cut", failure))
    line = tally.summary_line(2.0, stopped_by_user=False)
    assert "sent 5" in line and "ok 2, failed 3 (HTTP 503 ×2, stream cut ×1)" in line
    assert "p50 10 ms" in line
    assert "failed 3" in tally.progress_line(1.0, 1.0) and tally.window == []
