"""A supervised tensor-parallel simulator (`corral sim -tp 2`, one worker process per rank): both ranks
alive in /v1/state; a rank killed on a READY engine takes it FAILED at once, naming the rank (from the
rank watch, not the engine's later exit), then RECOVER brings it READY with two new rank processes and
nothing of the old engine left; a rank logging an NCCL error does the same; a rank lost during startup
is a startup failure that names it."""

from __future__ import annotations

import os
import signal
from typing import Any

import psutil

from tests.integration.test_supervisor_support import Supervised, gone, supervised

TP2 = ("--tensor-parallel-size", "2")


def _ranks(body: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in body.get("ranks") or []}


def _both_alive(body: dict[str, Any]) -> bool:
    ranks = _ranks(body)
    return len(ranks) == 2 and all(r["alive"] is True for r in ranks.values())


def _ready_with_both_ranks(sup: Supervised, timeout: float = 60) -> dict[str, Any]:
    return sup.wait_for(
        "READY with 2 live ranks", lambda b: b["state"] == "READY" and _both_alive(b), timeout
    )


def _first_failed(sup: Supervised) -> dict[str, Any]:
    return next(t for t in sup.transitions() if t["to"] == "FAILED")


def test_a_killed_rank_fails_the_ready_engine_naming_it_and_recover_brings_two_new_ranks() -> None:
    with supervised(sim_args=TP2, sup_args=("--failure-restarts", "1")) as sup:
        body = _ready_with_both_ranks(sup)
        assert body["world_size"] == 2
        ranks = _ranks(body)
        assert [ranks[r]["name"] for r in (0, 1)] == ["Worker_TP0", "Worker_TP1"]
        engine_pid = body["engine"]["pid"]
        children = {p.pid for p in psutil.Process(engine_pid).children(recursive=True)}
        old = {r: ranks[r]["pid"] for r in (0, 1)}
        assert set(old.values()) <= children  # the ranks are the engine's own processes

        os.kill(old[1], signal.SIGKILL)
        sup.wait_for("FAILED", lambda b: b["state"] != "READY", timeout=30)
        failed = _first_failed(sup)
        assert failed["reason"].startswith(f"rank 1 (Worker_TP1 pid {old[1]}) died"), failed
        evidence = failed["evidence"]
        assert evidence["source"] == "rank_watch" and evidence["rank"] == 1
        # the sim exits only seconds after its rank died: the FAILED came before any exit was known
        assert evidence["exit_code"] is None, evidence

        body = _ready_with_both_ranks(sup)
        new = {r: _ranks(body)[r]["pid"] for r in (0, 1)}
        assert not set(new.values()) & set(old.values())
        assert body["engine"]["pid"] != engine_pid
        assert all(gone(pid) for pid in (engine_pid, *old.values()))  # nothing of the old engine left
        restart = next(r for r in sup.oplog() if r["record"] == "engine_restart")
        assert restart["cause"] == "rank_lost" and restart["reason"] == failed["reason"]
        tos = [t["to"] for t in sup.transitions() if t["from"] not in (None, t["to"])]
        assert tos[-3:] == ["FAILED", "STARTING", "READY"], tos


def test_a_rank_logging_an_nccl_error_fails_the_engine_and_a_spent_budget_leaves_nothing_running() -> None:
    with supervised(
        sim_args=(*TP2, "--fail-rank", "1", "--fail-rank-after-seconds", "1"),
        sup_args=("--failure-restarts", "0"),
    ) as sup:
        body = _ready_with_both_ranks(sup)
        pids = [body["engine"]["pid"], *(r["pid"] for r in body["ranks"])]
        body = sup.wait_for("given up", lambda b: b.get("sub_state") == "gave_up", timeout=30)
        failed = _first_failed(sup)
        assert failed["reason"].startswith("rank 1 (Worker_TP1 pid "), failed
        assert "NCCL error" in failed["reason"] and failed["evidence"]["kind"] == "collective_failed"
        assert "restart budget spent" in body["reason"]
        assert all(gone(pid) for pid in pids)
        assert body["engine"]["pid"] is None


def test_a_rank_lost_during_startup_is_a_startup_failure_that_names_it() -> None:
    with supervised(
        sim_args=(*TP2, "--startup-seconds", "10"),
        sup_args=("--startup-restarts", "1", "--startup-timeout", "120"),
    ) as sup:
        body = sup.wait_for("2 live ranks", _both_alive, timeout=60)
        assert body["state"] == "STARTING"
        victim = _ranks(body)[0]["pid"]
        os.kill(victim, signal.SIGKILL)
        body = sup.wait_for("a restart", lambda b: len(b["restarts"]) >= 1, timeout=30)
        restart = body["restarts"][0]
        assert restart["reason"].startswith(f"rank 0 (Worker_TP0 pid {victim}) died"), restart
        assert "during startup" in restart["reason"]
        record = next(r for r in sup.oplog() if r["record"] == "engine_restart")
        assert record["cause"] == "rank_lost"
        first_engine = sup.engine_pids()[0]
        assert gone(first_engine) and gone(victim)
