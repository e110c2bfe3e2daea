"""`corral doctor` tells an engine that answers nothing from one that answers but is stalled (issue 30),
from the supervisor states the not-answering rule and the stall rule leave."""

from __future__ import annotations

import asyncio
from typing import Any

from corral.fleet.checks.doctor import Diagnosis, diagnose_engine
from corral.fleet.checks.probe import EngineView


def diagnose(state: dict[str, Any], health: int | None) -> Diagnosis:
    view = EngineView("e0", "http://sup", "http://eng", state=state, health=health)
    return asyncio.run(diagnose_engine(view, 0.1))


def test_withdrawn_for_not_answering_is_its_own_branch_not_a_drain() -> None:
    found = diagnose(
        {
            "state": "DRAINING",
            "sub_state": "not_answering",
            "reason": "engine not answering: /health has not answered 200 for 5.0s",
            "since": 1.0,
            "evidence": {"probes_unanswered": 2, "probes_timed_out": 2, "last_answer": "HTTP 200"},
        },
        health=None,
    )
    assert found.branch == "not-ready/not-answering", found
    assert "2 /health probes unanswered (2 timed out)" in found.evidence and "HTTP 200" in found.evidence
    assert "--stall-seconds" in found.next_command and "py-spy" in found.next_command


def test_a_drain_is_still_a_drain() -> None:
    found = diagnose({"state": "DRAINING", "sub_state": "waiting_in_flight", "reason": "drain"}, health=200)
    assert found.branch == "not-ready/draining", found


def test_failed_for_silence_and_failed_while_answering_are_told_apart() -> None:
    silent = diagnose(
        {"state": "FAILED", "reason": "engine stopped answering /metrics for 60s: /metrics: TimeoutError"},
        health=None,
    )
    assert silent.branch == "requests-failing/not-answering" and "not answering" in silent.evidence, silent
    stalled = diagnose(
        {
            "state": "FAILED",
            "reason": "engine stalled: 4 requests running and no token generated for 60.2s",
        },
        health=200,
    )
    assert stalled.branch == "requests-failing/hang", stalled
    assert stalled.evidence.startswith("answering but stalled"), stalled
