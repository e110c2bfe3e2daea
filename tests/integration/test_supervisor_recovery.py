"""Restarts in place: an engine that exits during startup (a late dependency, no gate declared) and a
READY engine that hangs while /health stays 200. Each is restarted within its budget, every restart
is recorded with its exit code and last lines, and readiness is false while the engine is out."""

from __future__ import annotations

import socket
import time

from tests.integration.test_supervisor_support import short_tmp_dir, supervised


def test_engine_exiting_during_startup_is_restarted_in_place_with_the_evidence_kept() -> None:
    sock_path = short_tmp_dir() / "kv.sock"
    with supervised(
        sim_args=("--requires", f"unix:{sock_path}"),
        sup_args=("--startup-restarts", "6", "--restart-backoff", "0.5"),
    ) as sup:
        body = sup.wait_for("a restart", lambda b: len(b["restarts"]) >= 1, timeout=30)
        assert sup.probe("/readyz")[0] == 503
        assert sup.probe("/livez")[0] == 200  # restarting legitimately: alive
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(sock_path))
        listener.listen(16)
        try:
            body = sup.wait_state("READY", timeout=60)
        finally:
            listener.close()
        restarts = body["restarts"]
        assert restarts and all(r["exit_code"] == 1 for r in restarts)
        assert any(str(sock_path) in line for line in restarts[0]["last_lines"])
        backoffs = [r["backoff_seconds"] for r in restarts]
        assert backoffs == sorted(backoffs) and backoffs[0] == 0.5
        records = [r for r in sup.oplog() if r["record"] == "engine_restart"]
        assert len(records) == len(restarts) and records[0]["cause"] == "startup_exit"
        _, startupz = sup.probe("/startupz")
        assert startupz["restarts"] == len(restarts)


def test_a_gate_free_engine_that_never_gets_its_dependency_gives_up_within_budget() -> None:
    sock_path = short_tmp_dir() / "never.sock"
    with supervised(
        sim_args=("--requires", f"unix:{sock_path}"),
        sup_args=("--startup-restarts", "2", "--restart-backoff", "0.2"),
    ) as sup:
        body = sup.wait_state("FAILED", timeout=60)
        assert "--startup-restarts 2 spent" in body["reason"] and "code 1" in body["reason"]
        assert len(body["restarts"]) == 2 and len(sup.engine_pids()) == 3
        assert sup.probe("/livez")[0] == 503


def test_hung_engine_is_detected_restarted_and_ready_again() -> None:
    # --hang-after 3: the smoke request and two idle smokes pass, the next request never gets a token
    with supervised(
        sim_args=("--hang-after", "3"),
        sup_args=("--stall-seconds", "1", "--failure-restarts", "1"),
    ) as sup:
        sup.wait_state("READY", timeout=30)
        readyz: list[tuple[int, str]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status, body = sup.probe("/readyz")
            readyz.append((status, body["state"]))
            if body["state"] == "FAILED" and body["sub_state"] == "gave_up":
                break
            time.sleep(0.05)
        transitions = sup.transitions()
        tos = [t["to"] for t in transitions if t["from"] not in (None, t["to"])]
        # READY → FAILED (stall) → STARTING (restart in place) → READY → FAILED (budget spent)
        assert tos[:5] == ["READY", "FAILED", "STARTING", "READY", "FAILED"], tos
        stall = next(t for t in transitions if t["to"] == "FAILED")
        assert "stalled" in stall["reason"] or "idle smoke" in stall["reason"], stall
        assert "restart budget spent" in transitions[-1]["reason"]
        # readiness dropped while the engine was out, and came back
        states = [s for _, s in readyz]
        first_out = next(i for i, s in enumerate(states) if s != "READY")
        assert "READY" in states[first_out:]
        assert all((status == 200) == (state == "READY") for status, state in readyz)
        pids = sup.engine_pids()
        assert len(pids) == 2 and pids[0] != pids[1]
        restart = next(r for r in sup.oplog() if r["record"] == "engine_restart")
        assert restart["cause"] == "failure"


def test_an_engine_serving_another_model_is_failed_not_ready() -> None:
    with supervised(sup_args=("--model", "llama-3-8b-instruct")) as sup:
        body = sup.wait_state("FAILED", timeout=30)
        assert "llama-3-8b-instruct" in body["reason"] and "sim-model" in body["reason"]
        assert sup.probe("/readyz")[0] == 503 and body["restarts"] == []
