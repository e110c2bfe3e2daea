"""A weight reload on a supervised `corral sim` that behaves as vLLM does (`--no-memory-metrics`: no
weights size, no memory gauges) is judged by more than its HTTP status: each rank's `collective_rpc`
result (a rank that raised fails the operation, RECOVER runs, the FAILED reason names the rank), the
bundle fingerprint read again (the change record says from → to; the same files reloaded say so),
startup's KV-capacity check repeated, and a smoke that must be a real completion of the model.
Real processes on loopback (issue 29, item 4)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_supervisor_sleep_ops import (
    DEV,
    GIB,
    SUP_ARGS,
    call,
    finish,
    state,
    step_evidence,
    steps,
    wait_state,
)
from tests.integration.test_supervisor_support import Supervised, supervised
from tests.support.model_dirs import make_model_dir
from tests.unit.test_gpu_sleep_cycle import load

gpu_sleep_cycle = load()

AS_VLLM = ("--enable-sleep-mode", "--no-memory-metrics", "--itl-ms", "5")
OP_TIMEOUT = 90.0  # a loaded two-core machine; bounded
READY_TIMEOUT = 90.0


@pytest.fixture
def token_file(tmp_path: Path) -> str:
    path = tmp_path / "token"
    path.write_text("sleep-ops-token")
    return str(path)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path / "model", weights_bytes=2 * GIB, shards=2)


def reload(s: Supervised, op_id: str) -> dict[str, Any]:
    status, op = call(s, "/v1/reload", {"operation_id": op_id})
    assert status == 202, op
    return finish(s, op, OP_TIMEOUT)


def change_record(s: Supervised, op_id: str) -> dict[str, Any]:
    (record,) = [r for r in s.oplog() if r["record"] == "change_record" and r.get("id") == op_id]
    return record


@pytest.fixture
def as_vllm(model_dir: Path, token_file: str) -> Iterator[Supervised]:
    sim = ("--model", str(model_dir), "--served-model-name", "m", *AS_VLLM)
    with supervised(sim_args=sim, sup_args=(*SUP_ARGS, token_file), env=DEV) as s:
        wait_state(s, "READY", READY_TIMEOUT)
        yield s


@pytest.mark.parametrize(
    ("tp", "rank", "named"),
    [("2", "1", "rank 1 (Worker_TP1 pid"), ("1", "0", "rank 0")],  # TP 1: the worker is the engine core
)
def test_a_rank_whose_reload_raises_fails_the_operation_and_is_named(
    token_file: str, tp: str, rank: str, named: str
) -> None:
    sim = (*AS_VLLM, "--tensor-parallel-size", tp, "--fail-reload-rank", rank)
    with supervised(sim_args=sim, sup_args=(*SUP_ARGS, token_file), env=DEV) as s:
        wait_state(s, "READY", READY_TIMEOUT)
        op = reload(s, "reload-rank")
        assert op["status"] == "failed", op
        assert f"reload_weights failed in {named}" in op["error"], op
        assert [step for step, _ in steps(s, "reload-rank")][-2:] == ["execute", "recover"]
        failed = step_evidence(s, "reload-rank", "execute")
        (found,) = failed["ranks"]
        assert found["rank"] == int(rank) and found["ok"] is False, failed
        assert "size mismatch" in found["error"], failed
        # RECOVER: FAILED naming the rank, then a fresh engine from disk
        wait_state(s, "READY", READY_TIMEOUT)
        named_failed = [t for t in s.transitions() if t["state"] == "FAILED"]
        assert named_failed and f"rank {rank}" in named_failed[-1]["reason"], named_failed
        assert len(s.engine_pids()) == 2


def test_every_rank_answers_for_its_reload(token_file: str) -> None:
    sim = (*AS_VLLM, "--tensor-parallel-size", "2")
    with supervised(sim_args=sim, sup_args=(*SUP_ARGS, token_file), env=DEV) as s:
        wait_state(s, "READY", READY_TIMEOUT)
        op = reload(s, "reload-ranks")
        assert op["status"] == "succeeded", op
        (call_ranks,) = [
            c["reload_weights"]
            for c in step_evidence(s, "reload-ranks", "execute")["calls"]
            if "reload_weights" in c
        ]
        assert [(r["rank"], r["ok"]) for r in call_ranks["ranks"]] == [(0, True), (1, True)]


def test_new_files_change_the_fingerprint_and_the_record_says_from_what_to_what(
    as_vllm: Supervised, model_dir: Path
) -> None:
    before = state(as_vllm)["bundle"]["fingerprint"]
    shard = sorted(model_dir.glob("*.safetensors"))[0]
    with shard.open("r+b") as fh:  # new weights, same size: what a checkpoint update writes
        fh.write(b"\x01" * 4096)
    op = reload(as_vllm, "reload-new")
    assert op["status"] == "succeeded", op
    identity = step_evidence(as_vllm, "reload-new", "verify")["identity"]
    after = state(as_vllm)["bundle"]["fingerprint"]
    assert identity["fingerprint"] == {"from": before, "to": after} and before != after, identity
    assert identity["files"] == "changed" and identity["changed"] is True
    record = change_record(as_vllm, "reload-new")
    assert record["from_bundles"][as_vllm.engine_url]["fingerprint"] == before
    assert record["to_bundle"]["fingerprint"] == after


def test_a_reload_of_the_same_files_says_so_and_keeps_the_fingerprint(as_vllm: Supervised) -> None:
    """Also what the GPU check (`benchmarks/gpu_sleep_cycle.py`) reads of a reload holds here."""
    state_before = state(as_vllm)
    before = state_before["bundle"]["fingerprint"]
    op = reload(as_vllm, "reload-same")
    assert op["status"] == "succeeded", op
    gpu_check = gpu_sleep_cycle.reload_checks({"operation": op}, state_before, state(as_vllm))
    assert all(gpu_check.values()), gpu_check
    identity = step_evidence(as_vllm, "reload-same", "verify")["identity"]
    assert identity["fingerprint"] == {"from": before, "to": before}, identity
    assert identity["files"].startswith("unchanged") and identity["changed"] is False
    record = change_record(as_vllm, "reload-same")
    assert record["to_bundle"]["fingerprint"] == record["from_bundles"][as_vllm.engine_url]["fingerprint"]


def test_the_reload_repeats_the_kv_capacity_check(tmp_path: Path, token_file: str) -> None:
    """The budget leaves no headroom (`--headroom-gib 0`): vLLM's KV cache, sized once at start and
    mapped back by the reload's `wake_up kv_cache`, is short of it; the reload's VERIFY says so."""
    model = make_model_dir(tmp_path / "big", weights_bytes=4 * GIB)
    sim = ("--model", str(model), "--gpu-memory-gib", "8", "--gpu-memory-utilization", "0.9", *AS_VLLM)
    sup = (*SUP_ARGS, token_file, "--headroom-gib", "0")
    with supervised(sim_args=sim, sup_args=sup, env=DEV) as s:
        wait_state(s, "READY", READY_TIMEOUT)
        op = reload(s, "reload-kv")
        assert op["status"] == "succeeded", op
        capacity = step_evidence(s, "reload-kv", "verify")["kv_capacity"]
        assert capacity["outcome"] == "failed" and "below the budget's" in capacity["reason"], capacity
        assert capacity["logged_tokens"] < capacity["expected_tokens"]
        assert state(s)["engine_evidence"]["kv_shortfall"]["count"] == 2  # at READY, and after the reload
        ready = [t for t in s.transitions() if t["state"] == "READY"][-1]
        assert ready["evidence"]["kv_capacity"] == "failed", ready


@pytest.mark.parametrize("answer", ["other-model", "no-choices", "error-body"])
def test_a_smoke_that_is_no_real_completion_fails_verify(token_file: str, answer: str) -> None:
    """The start's smoke is the first inference request; the reload's VERIFY smoke the second."""
    sim = (*AS_VLLM, "--wrong-answer", answer, "--wrong-answer-after", "1")
    with supervised(sim_args=sim, sup_args=(*SUP_ARGS, token_file), env=DEV) as s:
        wait_state(s, "READY", READY_TIMEOUT)
        op = reload(s, "reload-smoke")
        assert op["status"] == "failed" and "reload failed at verify" in op["error"], op
        assert "smoke" in op["error"], op
        assert [step for step, _ in steps(s, "reload-smoke")][-2:] == ["verify", "recover"]


def test_a_wake_with_reload_reads_every_rank_and_the_new_fingerprint(
    as_vllm: Supervised, model_dir: Path
) -> None:
    """A level-2 sleep, new files, then `wake {reload: true}`: the same reading as a reload."""
    before = state(as_vllm)["bundle"]["fingerprint"]
    status, op = call(as_vllm, "/v1/sleep", {"level": 2, "operation_id": "sleep-2"})
    assert status == 202 and finish(as_vllm, op, OP_TIMEOUT)["status"] == "succeeded"
    shard = sorted(model_dir.glob("*.safetensors"))[-1]
    with shard.open("r+b") as fh:
        fh.write(b"\x02" * 4096)
    status, op = call(as_vllm, "/v1/wake", {"reload": True, "operation_id": "wake-reload"})
    assert status == 202, op
    assert finish(as_vllm, op, OP_TIMEOUT)["status"] == "succeeded"
    (rpc,) = [
        c["reload_weights"]
        for c in step_evidence(as_vllm, "wake-reload", "execute")["calls"]
        if "reload_weights" in c
    ]
    assert [(r["rank"], r["ok"]) for r in rpc["ranks"]] == [(0, True)]
    identity = step_evidence(as_vllm, "wake-reload", "verify")["identity"]
    after = state(as_vllm)["bundle"]["fingerprint"]
    assert identity["fingerprint"] == {"from": before, "to": after} and before != after, identity
