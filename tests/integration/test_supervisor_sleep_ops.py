"""The runbook operations on a supervised `corral sim` (dev mode, sleep mode): sleep, wake, KV
release and weight reload, each recorded step by step in the operation log; the illegal sequences
refused with 409 and nothing changed; a wake that fails at a step leaves the engine FAILED with the
step named, and the engine is restarted in place. Real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.test_supervisor_support import Supervised, http_json, supervised

DEV = {"VLLM_SERVER_DEV_MODE": "1"}
GIB = 2**30
SIM_ARGS = ("--enable-sleep-mode", "--weights-gib", "2", "--kv-cache-gib", "4", "--itl-ms", "5")
SUP_ARGS = ("--propagation-timeout", "3", "--quiet-period", "0.3", "--token-file")
STEPS = ["precheck", "remove_from_routing", "drain_policy", "execute", "verify", "postcheck"]
TOKEN = "sleep-ops-token"


@pytest.fixture
def token_file(tmp_path: Any) -> str:
    path = tmp_path / "token"
    path.write_text(TOKEN)
    return str(path)


@pytest.fixture
def sup(token_file: str) -> Iterator[Supervised]:
    with supervised(sim_args=SIM_ARGS, sup_args=(*SUP_ARGS, token_file), env=DEV) as s:
        wait_state(s, "READY")
        yield s


def call(s: Supervised, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    return http_json(s.url + path, "POST", body or {}, token=TOKEN)


def state(s: Supervised) -> dict[str, Any]:
    return http_json(s.url + "/v1/state", token=TOKEN)[1]


def finish(s: Supervised, op: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    op_id = op["operation_id"]

    def done(_: dict[str, Any]) -> bool:
        return http_json(f"{s.url}/v1/operations/{op_id}", token=TOKEN)[1]["status"] != "running"

    wait_authorized(s, done, timeout)
    return http_json(f"{s.url}/v1/operations/{op_id}", token=TOKEN)[1]


def wait_state(s: Supervised, name: str, timeout: float = 30.0) -> None:
    wait_authorized(s, lambda _: state(s).get("state") == name, timeout)


def wait_authorized(s: Supervised, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check(None):
            return
        time.sleep(0.1)
    raise AssertionError(f"not done after {timeout}s:\n{s.proc.output()[-4000:]}")


def steps(s: Supervised, op_id: str) -> list[tuple[str, str]]:
    return [
        (r["step"], r["status"])
        for r in s.oplog()
        if r["record"] == "runbook_step" and r["operation_id"] == op_id
    ]


def step_evidence(s: Supervised, op_id: str, step: str) -> dict[str, Any]:
    (record,) = [
        r
        for r in s.oplog()
        if r["record"] == "runbook_step" and r["operation_id"] == op_id and r["step"] == step
    ]
    return record["evidence"]


def test_sleep_level_1_then_wake_each_step_logged_and_memory_moves(sup: Supervised) -> None:
    status, op = call(sup, "/v1/sleep", {"level": 1, "mode": "wait", "operation_id": "sleep-1"})
    assert status == 202, op
    op = finish(sup, op)
    assert op["status"] == "succeeded", op
    assert steps(sup, "sleep-1") == [(s, "done") for s in STEPS]
    verify = step_evidence(sup, "sleep-1", "verify")
    assert verify["sleep_state"] == "weights_offloaded"
    assert verify["memory"]["gpu_weights_bytes"] == [2 * GIB, 0]
    assert verify["memory"]["gpu_kv_cache_bytes"] == [4 * GIB, 0]
    assert verify["memory"]["cpu_backup_bytes"] == [0, 2 * GIB]
    body = state(sup)
    assert body["state"] == "SLEEPING" and body["sub_state"] == "level_1" and body["sleep"]["level"] == 1
    # the same operation id is the same run
    again_status, again = call(sup, "/v1/sleep", {"level": 1, "operation_id": "sleep-1"})
    assert again_status == 200 and again["operation_id"] == "sleep-1"

    status, op = call(sup, "/v1/wake", {"operation_id": "wake-1"})
    assert status == 202, op
    op = finish(sup, op)
    assert op["status"] == "succeeded", op
    assert steps(sup, "wake-1") == [(s, "done") for s in STEPS]
    verify = step_evidence(sup, "wake-1", "verify")
    assert verify["figures"]["gpu_weights_bytes"] == 2 * GIB and verify["figures"]["cpu_backup_bytes"] == 0
    assert verify["smoke"]["text"]
    assert state(sup)["state"] == "READY"
    states = [t["state"] for t in sup.transitions()]
    tail = states[states.index("DRAINING") :]
    assert tail[:1] == ["DRAINING"] and "SLEEPING" in tail and tail[-2:] == ["WAKING", "READY"], tail


def test_illegal_sequences_are_refused_and_change_nothing(sup: Supervised) -> None:
    assert http_json(sup.url + "/v1/sleep", "POST", {"level": 1})[0] == 401  # no token
    status, body = call(sup, "/v1/wake")
    assert status == 409 and "not SLEEPING" in body["error"]["message"], body
    assert call(sup, "/v1/sleep", {"level": 7})[0] == 409
    # a level-0 keep pause, then KV release: the runbook's "release KV cache only"
    status, op = call(sup, "/v1/sleep", {"level": 0, "mode": "keep", "release_kv": True})
    assert status == 202, op
    assert finish(sup, op)["status"] == "succeeded"
    verify = step_evidence(sup, op["operation_id"], "verify")
    assert verify["memory"]["gpu_kv_cache_bytes"] == [4 * GIB, 0]
    assert verify["memory"]["gpu_weights_bytes"] == [2 * GIB, 2 * GIB]
    epoch = state(sup)["epoch"]
    # releasing the KV cache twice
    status, body = call(sup, "/v1/sleep", {"level": 0, "mode": "keep", "release_kv": True})
    assert status == 409 and "SLEEPING" in body["error"]["message"], body
    # wake tags that do not exist; a tag that is not asleep (the KV release left the weights resident)
    status, body = call(sup, "/v1/wake", {"tags": ["weights", "gpu"]})
    assert status == 409 and "do not exist" in body["error"]["message"], body
    status, body = call(sup, "/v1/wake", {"tags": ["weights"]})
    assert status == 409 and "not asleep" in body["error"]["message"], body
    assert state(sup)["epoch"] == epoch  # nothing changed
    assert finish(sup, call(sup, "/v1/wake")[1])["status"] == "succeeded"

    # level 2 and a wake without reload
    op = call(sup, "/v1/sleep", {"level": 2, "mode": "abort"})[1]
    assert finish(sup, op)["status"] == "succeeded"
    assert step_evidence(sup, op["operation_id"], "verify")["sleep_state"] == "discard_all"
    epoch = state(sup)["epoch"]
    status, body = call(sup, "/v1/wake")
    assert status == 409 and "reload" in body["error"]["message"], body
    assert state(sup)["epoch"] == epoch
    op = call(sup, "/v1/wake", {"reload": True})[1]
    assert finish(sup, op)["status"] == "succeeded", op
    assert step_evidence(sup, op["operation_id"], "precheck")["sequence"][:2] == [
        "wake_up?tags=weights",
        "collective_rpc reload_weights",
    ]
    assert state(sup)["state"] == "READY"


def test_weight_reload_runs_the_level_2_path(sup: Supervised) -> None:
    op = call(sup, "/v1/reload", {"operation_id": "reload-1"})[1]
    op = finish(sup, op)
    assert op["status"] == "succeeded", op
    assert steps(sup, "reload-1") == [(s, "done") for s in STEPS]
    calls = [next(iter(c)) for c in step_evidence(sup, "reload-1", "execute")["calls"]]
    assert calls == ["sleep level 2", "wake_up weights", "reload_weights", "wake_up kv_cache", "wake_up"]
    assert step_evidence(sup, "reload-1", "verify")["figures"]["weights_valid"] == 1
    assert state(sup)["state"] == "READY"


def test_a_wake_that_fails_leaves_the_engine_failed_with_the_step_named(token_file: str) -> None:
    with supervised(
        sim_args=(*SIM_ARGS, "--fail-wake-tag", "weights"), sup_args=(*SUP_ARGS, token_file), env=DEV
    ) as s:
        wait_state(s, "READY")
        assert finish(s, call(s, "/v1/sleep", {"level": 1})[1])["status"] == "succeeded"
        op = finish(s, call(s, "/v1/wake", {"operation_id": "wake-fails"})[1])
        assert op["status"] == "failed" and "execute" in op["error"] and "wake_up" in op["error"], op
        assert steps(s, "wake-fails") == [
            ("precheck", "done"),
            ("remove_from_routing", "done"),
            ("drain_policy", "done"),
            ("execute", "failed"),
            ("recover", "done"),
        ]
        failed = [t for t in s.transitions() if t["state"] == "FAILED"]
        assert failed and "wake failed at execute" in failed[-1]["reason"], failed
        assert "CUDA out of memory" in step_evidence(s, "wake-fails", "execute")["error"]
        # RECOVER restarted the engine in place: a fresh engine, READY, awake
        wait_state(s, "READY")
        assert len(s.engine_pids()) == 2


def corral(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_STATE_HOME": tempfile.mkdtemp(prefix="corral-state-")}  # the change record's
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def test_cli_sleep_wake_and_a_refusal(sup: Supervised, token_file: str) -> None:
    common = ("--supervisor", sup.url, "--token-file", token_file)
    refused = corral("wake", *common)
    # the printed answer is the contract: what the person who ran the command reads
    assert refused.returncode == 2 and "not SLEEPING" in refused.stdout, refused
    slept = corral("sleep", *common, "--level", "2", "--mode", "abort", "--operation-id", "cli-sleep")
    assert slept.returncode == 0, slept
    assert "verify: done" in slept.stdout and "cli-sleep succeeded" in slept.stdout, slept.stdout
    assert corral("wake", *common).returncode == 2  # level 2 needs --reload
    woke = corral("wake", *common, "--reload")
    assert woke.returncode == 0, woke
    assert state(sup)["state"] == "READY"
    assert corral("reload", "--supervisor", sup.url).returncode == 2  # no token: 401


def test_a_reload_that_fails_never_serves_unknown_weights(token_file: str) -> None:
    with supervised(
        sim_args=(*SIM_ARGS, "--fail-wake-tag", "weights"), sup_args=(*SUP_ARGS, token_file), env=DEV
    ) as s:
        wait_state(s, "READY")
        op = finish(s, call(s, "/v1/reload", {"operation_id": "reload-fails"})[1])
        assert op["status"] == "failed" and "reload failed at execute" in op["error"], op
        assert [step for step, _ in steps(s, "reload-fails")][-2:] == ["execute", "recover"]
        # the engine went FAILED (never READY on the half-woken weights), then a fresh engine loaded from disk
        wait_state(s, "READY")
        after = [t["state"] for t in s.transitions()]
        tail = after[len(after) - after[::-1].index("DRAINING") :]
        assert "FAILED" in tail and tail.index("FAILED") < tail.index("READY"), tail
        assert "READY" not in tail[: tail.index("FAILED")], tail
        assert len(s.engine_pids()) == 2
