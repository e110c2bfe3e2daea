"""The PRECHECK gate: every check in order, not_measured never refusing nor counting as passed, the
first refusal named in the reason, and a check that cannot run refusing rather than letting an unknown
start through."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from corral.supervisor.precheck.check import Outcome
from corral.supervisor.precheck.gate import PrecheckSettings, run_precheck
from corral.supervisor.precheck.identity import IdentityExpectations
from tests.support.model_dirs import GIB, make_model_dir

SIM = (sys.executable, "-m", "corral", "sim", "--port", "8000")
ORDER = ["artifact_identity", "parallel_identity", "memory_budget", "environment", "preload"]


def test_a_plain_simulator_is_authorized_saying_what_was_not_measured() -> None:
    report = asyncio.run(run_precheck((*SIM, "--model", "sim-model"), {}, PrecheckSettings()))
    assert [c.name for c in report.checks] == ORDER
    assert report.authorized and report.refusal is None
    outcomes = {c.name: c.outcome for c in report.checks}
    assert outcomes["memory_budget"] is Outcome.NOT_MEASURED and outcomes["preload"] is Outcome.SKIPPED
    assert report.reason == "PRECHECK authorized the start (parallel_identity, memory_budget not measured)"
    body = report.to_json()
    assert body["outcome"] == "authorized" and body["authorized_at"] == report.finished_at
    assert report.artifact is not None and body["fingerprint"] == report.artifact.fingerprint
    assert "evidence" not in report.summary()["checks"][0]


def test_the_first_refusal_is_the_reason_and_nothing_is_authorized(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m", weights_bytes=30 * GIB)
    argv = (*SIM, "--model", str(model), "--gpu-memory-gib", "24", "--max-model-len", "4096")
    settings = PrecheckSettings(identity=IdentityExpectations(expect_fingerprint="0123456789abcdef"))
    report = asyncio.run(run_precheck(argv, {}, settings))
    refused = [c.name for c in report.checks if c.refused]
    assert refused == ["artifact_identity", "memory_budget"]
    assert report.reason.startswith("PRECHECK refused the start: artifact_identity: fingerprint ")
    assert report.to_json()["authorized_at"] is None and report.to_json()["outcome"] == "refused"


def test_a_check_that_cannot_run_refuses() -> None:
    report = asyncio.run(
        run_precheck((*SIM, "--model", "m", "--gpu-memory-gib", "lots"), {}, PrecheckSettings())
    )
    assert not report.authorized and report.artifact is None
    assert "a check could not run" in report.reason and "'lots'" in report.reason
