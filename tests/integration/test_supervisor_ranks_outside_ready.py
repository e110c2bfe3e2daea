"""Ranks outside READY, on a supervised tensor-parallel `corral sim` configured as vLLM is (no memory
figures: `--no-memory-metrics`; one worker process per rank): a rank killed while the engine SLEEPS
fails it at once (FAILED naming the rank, not a wake that finds it dead), and a restart in place
brings it READY with new ranks; a rank killed while a sleep operation drains fails the step, RECOVER
runs and the FAILED state names the rank; a rank the log never shows keeps the engine from READY;
a sleep's VERIFY and POSTCHECK look at every rank, and its change record carries the ranks before
and after. Real processes on loopback."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import urllib.request
from typing import Any

from tests.integration.test_supervisor_support import Supervised, http_json, supervised
from tests.support.waits import wait_until

DEV = {"VLLM_SERVER_DEV_MODE": "1"}
VLLM_LIKE_TP2 = ("--tensor-parallel-size", "2", "--enable-sleep-mode", "--no-memory-metrics")
SUP_ARGS = ("--propagation-timeout", "3", "--quiet-period", "0.3", "--failure-restarts", "2")
RUNNING = "vllm:num_requests_running"
WAIT = 90.0  # generous: the machine is loaded; every wait ends as soon as its condition holds


def _ranks(body: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in body.get("ranks") or []}


def _ready_with_both_ranks(sup: Supervised) -> dict[str, Any]:
    def ready(b: dict[str, Any]) -> bool:
        ranks = _ranks(b)
        return b["state"] == "READY" and len(ranks) == 2 and all(r["alive"] is True for r in ranks.values())

    return sup.wait_for("READY with 2 live ranks", ready, WAIT)


def _start_op(sup: Supervised, path: str, body: dict[str, Any]) -> str:
    status, op = http_json(sup.url + path, "POST", body)
    assert status == 202, op
    return str(op["operation_id"])


def _finished(sup: Supervised, op_id: str) -> dict[str, Any]:
    final = sup.wait_for(
        f"operation {op_id} finished",
        lambda b: any(o["operation_id"] == op_id and o["status"] != "running" for o in b["operations"]),
        WAIT,
    )
    (done,) = [o for o in final["operations"] if o["operation_id"] == op_id]
    return dict(done)


def _failed_from(sup: Supervised, state: str) -> dict[str, Any] | None:
    return next((t for t in sup.transitions() if t["to"] == "FAILED" and t["from"] == state), None)


def _steps(sup: Supervised, op_id: str) -> dict[str, dict[str, Any]]:
    return {r["step"]: r for r in sup.oplog() if r["record"] == "runbook_step" and r["operation_id"] == op_id}


def _change_record(sup: Supervised, op_id: str) -> dict[str, Any]:
    (record,) = [r for r in sup.oplog() if r["record"] == "change_record" and r.get("id") == op_id]
    return dict(record)


def _asleep(sup: Supervised, op_id: str) -> dict[str, Any]:
    """READY with both ranks, then a level-1 sleep (mode abort) that succeeds: the SLEEPING state."""
    _ready_with_both_ranks(sup)
    assert _start_op(sup, "/v1/sleep", {"level": 1, "mode": "abort", "operation_id": op_id}) == op_id
    assert _finished(sup, op_id)["status"] == "succeeded"
    return sup.wait_state("SLEEPING", WAIT)


def test_a_sleeps_verify_postcheck_and_change_record_carry_every_rank() -> None:
    with supervised(sim_args=VLLM_LIKE_TP2, sup_args=SUP_ARGS, env=DEV) as sup:
        body = _asleep(sup, "s0")
        pids = {r["pid"] for r in body["ranks"]}
        steps = _steps(sup, "s0")
        assert steps["postcheck"]["evidence"]["ranks"]["whole"] is True, steps["postcheck"]
        assert steps["verify"]["evidence"]["ranks"]["alive"] == 2, steps["verify"]
        ranks = _change_record(sup, "s0")["ranks"]
        assert ranks["before"]["whole"] and ranks["after"]["whole"], ranks
        assert ranks["before"]["world_size"] == 2 and ranks["after"]["alive"] == 2, ranks
        assert {r["pid"] for r in ranks["after"]["ranks"]} == pids, ranks


def test_a_rank_killed_while_the_engine_sleeps_fails_it_naming_the_rank_then_restarts_it() -> None:
    with supervised(sim_args=VLLM_LIKE_TP2, sup_args=SUP_ARGS, env=DEV) as sup:
        body = _asleep(sup, "s1")
        old = {r: _ranks(body)[r]["pid"] for r in (0, 1)}
        engine_pid = body["engine"]["pid"]

        os.kill(old[1], signal.SIGKILL)  # no wake asked for: the sleeping engine's own watch acts
        sup.wait_for("FAILED from SLEEPING", lambda _b: _failed_from(sup, "SLEEPING") is not None, WAIT)
        failed = _failed_from(sup, "SLEEPING")
        assert failed is not None
        assert failed["reason"].startswith(f"rank 1 (Worker_TP1 pid {old[1]}) died"), failed
        assert "while SLEEPING" in failed["reason"], failed
        assert failed["evidence"]["source"] == "rank_watch" and failed["evidence"]["rank"] == 1, failed
        assert failed["evidence"]["sleep"]["level"] == 1, failed

        body = _ready_with_both_ranks(sup)  # restarted in place: awake, two new ranks
        assert body["engine"]["pid"] != engine_pid
        assert not {r["pid"] for r in body["ranks"]} & set(old.values())
        restart = [r for r in sup.oplog() if r["record"] == "engine_restart"][-1]
        assert restart["cause"] == "rank_lost" and restart["reason"] == failed["reason"], restart
        # no wake was ever tried on the dead engine
        assert not [r for r in sup.oplog() if r["record"] == "runbook_step" and r["kind"] == "wake"]


def _running(engine_url: str) -> float:
    """vLLM's `vllm:num_requests_running`, read from the engine's /metrics."""
    with urllib.request.urlopen(engine_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(RUNNING)]
    return sum(values)


def _long_completion(engine_url: str, done: threading.Event) -> None:
    """One request that streams for tens of seconds: a sleep with mode wait waits for it."""
    body = {"model": "sim-model", "prompt": "tell a long story", "max_tokens": 600, "stream": True}
    req = urllib.request.Request(
        engine_url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=WAIT) as resp:
            while resp.read(1024):
                pass
    except (OSError, http.client.HTTPException):
        pass  # the engine died under it: what the test does
    finally:
        done.set()


def test_a_rank_killed_while_a_sleep_drains_fails_the_step_runs_recover_and_names_the_rank() -> None:
    with supervised(
        sim_args=(*VLLM_LIKE_TP2, "--itl-ms", "100"),
        sup_args=(*SUP_ARGS, "--drain-timeout", "60"),
        env=DEV,
    ) as sup:
        body = _ready_with_both_ranks(sup)
        victim = _ranks(body)[1]["pid"]
        done = threading.Event()
        streaming = threading.Thread(target=_long_completion, args=(sup.engine_url, done), daemon=True)
        streaming.start()
        wait_until(lambda: _running(sup.engine_url) >= 1, WAIT, "the long request running in the engine")
        op_id = _start_op(sup, "/v1/sleep", {"level": 1, "mode": "wait", "operation_id": "s2"})
        sup.wait_for(
            "the sleep waiting for its in-flight request",
            lambda b: (
                (b.get("operation") or {}).get("step") == "drain_policy"
                and b.get("sub_state") == "waiting_in_flight"
            ),
            WAIT,
        )
        os.kill(victim, signal.SIGKILL)

        op = _finished(sup, op_id)
        assert op["status"] == "failed", op
        steps = _steps(sup, op_id)
        assert steps["drain_policy"]["status"] == "failed", steps["drain_policy"]
        drained = steps["drain_policy"]["evidence"]
        assert drained["source"] == "rank_watch" and drained["rank"] == 1, drained
        recover = steps["recover"]["evidence"]
        assert recover["failed_step"] == "drain_policy", recover
        assert recover["cause"].startswith(f"rank 1 (Worker_TP1 pid {victim}) died"), recover
        assert recover["rank_lost"]["rank"] == 1, recover
        assert "execute" not in steps  # the sleep never reached the engine

        failed = _failed_from(sup, "DRAINING")
        assert failed is not None, sup.transitions()
        assert failed["reason"].startswith(f"rank 1 (Worker_TP1 pid {victim}) died"), failed
        assert failed["evidence"]["source"] == "rank_watch" and failed["evidence"]["rank"] == 1, failed
        ranks = _change_record(sup, op_id)["ranks"]
        assert ranks["before"]["whole"] is True, ranks
        _ready_with_both_ranks(sup)  # RECOVER restarted it in place
        done.wait(WAIT)


def test_ready_is_not_reached_while_a_rank_has_not_been_seen() -> None:
    with supervised(
        sim_args=(*VLLM_LIKE_TP2, "--unlogged-rank", "1"),
        sup_args=("--startup-timeout", "600"),
    ) as sup:

        def waiting_for_rank_1(b: dict[str, Any]) -> bool:
            assert b["state"] != "READY", f"READY with rank 1 never seen: {b}"
            return b["state"] == "STARTING" and "ranks: rank 1 not seen" in (b.get("reason") or "")

        body = sup.wait_for("STARTING, waiting for rank 1", waiting_for_rank_1, WAIT)
        assert body["sub_state"] == "smoke_testing", body  # health answered: only the rank is missing
        assert "1 of 2 seen" in body["reason"] and "VLLM_LOGGING_LEVEL" in body["reason"], body
        assert [r["rank"] for r in body["ranks"]] == [0] and body["world_size"] == 2, body
        status, _ = sup.probe("/readyz")
        assert status == 503
        assert not [t for t in sup.transitions() if t["to"] == "READY"]
