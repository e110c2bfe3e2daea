"""Memory truth on real processes: a supervised `corral sim` whose memory figures exist still verifies
its sleep and wake as before (source `engine_metrics`, passed), and one that hides them like vLLM
(`--no-memory-metrics`) on a host without NVML says `not_measured` in the sleep's and wake's VERIFY
evidence, in `/v1/state`, and in `corral verify`'s output (NOT MEASURED; a failure only with
`--require-measured`). The supervisor's `kv_cache_tokens` is the KV size the engine logged."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from corral.engine.gpus import read_gpus
from tests.integration.test_supervisor_partial_wake import run_op, step_evidence
from tests.integration.test_supervisor_sleep_ops import DEV, GIB, SIM_ARGS
from tests.integration.test_supervisor_support import Supervised, supervised
from tests.support.model_dirs import make_model_dir
from tests.support.procs import CorralProcess

SUP_ARGS = ("--propagation-timeout", "3", "--quiet-period", "0.3")

pytestmark = pytest.mark.skipif(
    read_gpus() is not None, reason="NVML answers here: the engine's memory would be measured, not missing"
)


@pytest.fixture
def with_figures() -> Iterator[Supervised]:
    with supervised(sim_args=SIM_ARGS, sup_args=SUP_ARGS, env=DEV) as s:
        s.wait_state("READY")
        yield s


@pytest.fixture
def without_figures() -> Iterator[Supervised]:
    with supervised(sim_args=(*SIM_ARGS, "--no-memory-metrics"), sup_args=SUP_ARGS, env=DEV) as s:
        s.wait_state("READY")
        yield s


def verify(s: Supervised, record: Path, *args: str) -> tuple[int, str, dict[str, Any]]:
    proc = CorralProcess(
        ["verify", "--supervisor", s.url, "--record", str(record), *args], env={"COLUMNS": "250"}
    )
    code = proc.wait_exit(60)
    return code, proc.output(), orjson.loads(record.read_bytes())


def check(body: dict[str, Any], name: str) -> dict[str, str]:
    (found,) = [c for c in body["checks"] if c["check"] == name]
    return found


def test_with_the_engines_figures_sleep_and_wake_verify_as_before(
    with_figures: Supervised, tmp_path: Path
) -> None:
    s = with_figures
    at_ready = s.state()["memory"]["last"]
    assert (at_ready["operation"], at_ready["outcome"], at_ready["source"]) == (
        "startup",
        "passed",
        "engine_metrics",
    )

    op = run_op(s, "/v1/sleep", {"level": 1, "mode": "wait"})
    assert op["status"] == "succeeded", op
    memory = step_evidence(s, op["operation_id"], "verify")["memory"]
    assert (memory["outcome"], memory["source"]) == ("passed", "engine_metrics")
    assert memory["gpu_weights_bytes"] == [2 * GIB, 0]

    op = run_op(s, "/v1/wake", {})
    assert op["status"] == "succeeded", op
    memory = step_evidence(s, op["operation_id"], "verify")["memory"]
    assert (memory["outcome"], memory["source"]) == ("passed", "engine_metrics")
    assert memory["gpu_weights_bytes"] == [2 * GIB, 2 * GIB]

    _, out, body = verify(s, tmp_path / "verify.json", "--require-measured")
    assert check(body, "memory")["verdict"] == "pass", out
    assert "wake (engine_metrics)" in check(body, "memory")["detail"]
    assert "memory" not in body["failed"] and "memory" not in body["not_measured"]


def test_without_figures_or_nvml_the_checks_say_not_measured(
    without_figures: Supervised, tmp_path: Path
) -> None:
    s = without_figures
    at_ready = s.state()["memory"]["last"]
    assert (at_ready["operation"], at_ready["outcome"], at_ready["source"]) == (
        "startup",
        "not_measured",
        None,
    )

    op = run_op(s, "/v1/sleep", {"level": 1, "mode": "wait"})
    assert op["status"] == "succeeded", op  # not measured is no failure of the operation
    memory = step_evidence(s, op["operation_id"], "verify")["memory"]
    assert memory["outcome"] == "not_measured" and memory["source"] is None, memory
    assert "NVML is not available" in memory["reason"]
    assert s.state()["memory"]["last"]["operation"] == "sleep"

    op = run_op(s, "/v1/wake", {})
    assert op["status"] == "succeeded", op
    memory = step_evidence(s, op["operation_id"], "verify")["memory"]
    assert memory["outcome"] == "not_measured", memory
    recorded = [r for r in s.oplog() if r["record"] == "memory_verified"]
    assert [(r["operation"], r["outcome"]) for r in recorded] == [
        ("startup", "not_measured"),
        ("sleep", "not_measured"),
        ("wake", "not_measured"),
    ]

    code, out, body = verify(s, tmp_path / "verify.json")
    assert check(body, "memory")["verdict"] == "not measured", out
    assert "memory" in body["not_measured"] and "memory" not in body["failed"]
    assert "NOT MEASURED: " in out and "memory" in out.split("NOT MEASURED: ", 1)[1].splitlines()[0]
    assert code == (1 if body["failed"] else 0), out

    code, out, body = verify(s, tmp_path / "verify.json", "--require-measured")
    assert code == 1 and "memory" in body["failed"], out
    assert check(body, "memory")["verdict"] == "fail"


def test_the_kv_size_in_state_is_the_one_the_engine_logged(with_figures: Supervised) -> None:
    logged = re.findall(r"GPU KV cache size: ([\d,]+) tokens", with_figures.proc.output())
    state = with_figures.state()
    expected = int(logged[-1].replace(",", "")) if logged else None
    assert state["kv_cache_tokens"] == expected
    assert state["memory"]["kv_capacity"]["logged_tokens"] == expected


def test_a_kv_cache_smaller_than_the_budget_is_kv_shortfall_evidence(tmp_path: Path) -> None:
    """The budget leaves no headroom (`--headroom-gib 0`); the simulated engine keeps its own ~1 GiB of
    profiling overhead, as vLLM would, so on an 8 GiB device with 4 GiB of weights it logs far fewer KV
    tokens than the budget expected."""
    model = make_model_dir(tmp_path / "model", weights_bytes=4 * GIB)
    sim = ("--model", str(model), "--gpu-memory-gib", "8", "--gpu-memory-utilization", "0.9")
    with supervised(sim_args=sim, sup_args=(*SUP_ARGS, "--headroom-gib", "0")) as s:
        s.wait_state("READY")
        state = s.state()
        capacity = state["memory"]["kv_capacity"]
        assert capacity["outcome"] == "failed", capacity
        assert capacity["logged_tokens"] == state["kv_cache_tokens"] < capacity["expected_tokens"]
        assert "below the budget's" in capacity["reason"]
        assert state["engine_evidence"]["kv_shortfall"]["count"] == 1
        records = [r for r in s.oplog() if r["record"] == "engine_evidence" and r["kind"] == "kv_shortfall"]
        assert len(records) == 1

        code, out, body = verify(s, tmp_path / "verify.json")
        assert code == 1 and {"kv_capacity", "evidence"} <= set(body["failed"]), out
        code, out, body = verify(s, tmp_path / "verify.json", "--explain", "kv_shortfall=headroom declared 0")
        assert not {"evidence", "kv_capacity"} & set(body["failed"]), out
        assert "explained: headroom declared 0" in check(body, "kv_capacity")["detail"]
