"""The line `corral rollout` / `corral rollback` print about the requests during the change: the
router's counters from the record, or why there are none."""

from __future__ import annotations

from rich.text import Text

from corral.contracts.records import RequestFailures, RolloutRecord
from corral.contracts.traffic import RequestCounts
from corral.fleet.rollout.progress import requests_line


def _record(**fields: object) -> RolloutRecord:
    base = {
        "kind": "rollout",
        "id": "r1",
        "corral_version": "0",
        "started": 0.0,
        "finished": 1.0,
        "outcome": "succeeded",
        "reason": "ok",
        "router": "http://127.0.0.1:1",
    }
    return RolloutRecord.model_validate({**base, **fields})


def _plain(markup: str) -> str:
    return Text.from_markup(markup).plain


def test_the_line_gives_the_routers_counts_during_the_change() -> None:
    before = RequestCounts(requests=100, errors=1)
    after = RequestCounts(requests=1157, errors=3, stream_failures=1, abandoned=2)
    failures = RequestFailures(source="r", before=before, after=after, during=after.minus(before))
    line = _plain(requests_line(_record(request_failures=failures)))
    assert line == (
        "requests during the rollout: 1057 answered by the router, 2 failed (1 streams cut; "
        "2 taken off a failed engine)"
    )


def test_without_counters_the_line_says_why() -> None:
    why = "request failures: the rollout stopped before PRECHECK read the router's totals"
    line = _plain(requests_line(_record(not_measured=[why, "memory: none"], kind="rollback")))
    assert line == f"requests during the rollback: not counted ({why})"
