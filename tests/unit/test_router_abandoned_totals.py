"""Requests abandoned on an engine the router judged failed are in the router's `totals`, the counts a
change record reads at an operation's start and end (`request_failures`)."""

from __future__ import annotations

from corral.contracts.records import RequestFailures
from corral.contracts.traffic import RequestCounts
from corral.router.telemetry.metrics import RouterMetrics


def test_totals_count_every_abandoned_request_whatever_became_of_it() -> None:
    metrics = RouterMetrics()
    for outcome in ("retried", "retried", "ended", "not_retried"):
        metrics.count_abandoned(outcome)
    assert metrics.totals().abandoned == 4


def test_the_abandoned_during_an_operation_are_its_own_figure() -> None:
    before = RequestCounts(requests=100, errors=1, stream_failures=0, abandoned=2)
    after = RequestCounts(requests=180, errors=2, stream_failures=1, abandoned=7)
    assert after.minus(before) == RequestCounts(requests=80, errors=1, stream_failures=1, abandoned=5)
    # an older router says nothing of it: zero, never an error
    assert RequestCounts.model_validate({"requests": 3, "errors": 0, "stream_failures": 0}).abandoned == 0
    failures = RequestFailures(source="router", before=before, after=after, during=after.minus(before))
    assert failures.to_wire()["during"]["abandoned"] == 5
