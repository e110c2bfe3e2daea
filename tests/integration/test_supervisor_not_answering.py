"""A READY engine that stops answering (its process frozen with SIGSTOP, as a GPU hang or a wedged
collective looks from outside) leaves routing within seconds — `/readyz` 503, DRAINING/not_answering
with the probes as evidence — and is neither failed nor restarted for it; resumed, it returns READY
through the smoke request, the same engine process. Frozen past `--stall-seconds`, the stall rule
fails it and restarts it in place."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import urllib.request

from tests.integration.test_supervisor_support import Supervised, http_json, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until

FROZEN_TO_503 = 15.0  # the bound on /readyz after the freeze (default --unanswered-seconds 5)


def freeze(sup: Supervised) -> int:
    """SIGSTOP the engine's process group (the supervisor starts it in a group of its own)."""
    pid = sup.engine_pids()[-1]
    os.killpg(pid, signal.SIGSTOP)
    return pid


def stop_all(sup: Supervised) -> None:
    """Teardown: resume every engine group (a stopped one would sit out the SIGTERM), then stop."""
    pids = sup.engine_pids()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGCONT)
    sup.proc.stop(grace=20)
    kill_leftovers(pids)


def metric(sup: Supervised, name: str) -> float:
    with urllib.request.urlopen(sup.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    return values[0] if values else 0.0


def doctor_branch(sup: Supervised) -> str:
    proc = CorralProcess(["doctor", "--supervisor", sup.url], env={"COLUMNS": "200"})
    proc.wait_exit(60)
    out = proc.output()
    (branch,) = re.findall(r"^branch [^:]+: (\S+)$", out, re.MULTILINE) or [out]
    return str(branch)


def test_a_frozen_engine_leaves_routing_and_returns_through_the_smoke_request() -> None:
    gate_port = free_port()
    gate = f"http://127.0.0.1:{gate_port}"
    # the defaults: --unanswered-seconds 5, --stall-seconds 60; the admission gate in front, as corral up
    sup = start_supervised(sup_args=("--gate-port", str(gate_port), "--gate-host", "127.0.0.1"))
    try:
        sup.wait_state("READY", timeout=60)
        pid = freeze(sup)
        wait_until(lambda: sup.probe("/readyz")[0] == 503, FROZEN_TO_503, "/readyz 503 after the freeze")
        body = sup.state()
        assert (body["state"], body["sub_state"]) == ("DRAINING", "not_answering"), body
        assert "not answering" in body["reason"] and "--unanswered-seconds 5" in body["reason"]
        evidence = body["evidence"]
        assert evidence["probes_unanswered"] >= 1 and evidence["probes_timed_out"] >= 1, evidence
        assert evidence["last_answer"] and evidence["last_probes"], evidence
        assert metric(sup, "corral_supervisor_not_answering_total") == 1.0
        assert sup.probe("/livez")[0] == 200  # the supervisor is fine; nothing is restarted for this
        # traffic from outside Corral is refused at the gate at once, not sent to the frozen engine
        body = {"model": "sim-model", "prompt": "hello", "max_tokens": 2}
        status, answer = http_json(gate + "/v1/completions", "POST", body, timeout=10)
        assert status == 503, (status, answer)
        assert doctor_branch(sup) == "not-ready/not-answering"

        os.killpg(pid, signal.SIGCONT)
        body = sup.wait_state("READY", timeout=30)
        assert "smoke completion answered" in body["reason"], body
        assert body["evidence"]["text"], body  # the smoke's answer is the READY event's evidence
        assert sup.probe("/readyz")[0] == 200
        assert sup.engine_pids() == [pid] and body["restarts"] == []
        moves = [(t["from"], t["to"], t["sub_state"]) for t in sup.transitions() if t["from"] is not None]
        back = moves.index(("DRAINING", "READY", None))
        assert moves[back - 1] == ("READY", "DRAINING", "not_answering"), moves
    finally:
        stop_all(sup)


def test_frozen_past_stall_seconds_is_failed_and_restarted_by_the_stall_rule() -> None:
    sup = start_supervised(sup_args=("--stall-seconds", "8", "--failure-restarts", "1"))
    try:
        sup.wait_state("READY", timeout=60)
        pid = freeze(sup)
        sup.wait_for("withdrawn", lambda b: b.get("sub_state") == "not_answering", timeout=FROZEN_TO_503)
        body = sup.wait_for(
            "READY on a new engine", lambda b: len(b["restarts"]) == 1 and b["state"] == "READY", 90
        )
        transitions = [t for t in sup.transitions() if t["from"] is not None]
        states = [(t["from"], t["to"], t["sub_state"]) for t in transitions]
        withdrawn = states.index(("READY", "DRAINING", "not_answering"))
        failed = next(i for i, t in enumerate(transitions) if t["to"] == "FAILED")
        assert withdrawn < failed, states
        # the stall rule failed it (the engine's /metrics silent for --stall-seconds), not the withdrawal
        assert transitions[failed]["from"] == "DRAINING", states
        assert "stopped answering /metrics for 8s" in transitions[failed]["reason"], transitions[failed]
        pids = sup.engine_pids()
        assert len(pids) == 2 and pids[0] == pid, pids
        assert body["restarts"][0]["reason"] == transitions[failed]["reason"]
    finally:
        stop_all(sup)
