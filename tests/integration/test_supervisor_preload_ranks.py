"""The preload daemon's ranks watched like the engine's (issue 29 item 5; the runbook's Preload VERIFY:
"daemon parent health 200 and every rank process alive"). `corral sim preload -tp 2` is vLLM's launcher
with two rank processes (a rank's death leaves the parent running, its /health 503): the supervisor
names the lost rank in /v1/state and the operation log, takes the engine out of routing, stops the
daemon and restarts it, then the engine from it. Real processes under `corral supervise`."""

from __future__ import annotations

import json
import os
import shlex
import signal
from pathlib import Path

from tests.integration.test_sim_preload import load_source
from tests.integration.test_supervisor_preload import daemon_command
from tests.integration.test_supervisor_support import kill_leftovers, short_tmp_dir, start_supervised
from tests.support.procs import free_port
from tests.support.waits import wait_until


def test_a_lost_daemon_rank_is_named_and_the_pair_restarted() -> None:
    socket = short_tmp_dir() / "wc.sock"
    health_port = free_port()
    daemon = daemon_command(health_port, socket, "--startup-seconds", "0.5", "-tp", "2")
    loader = json.dumps({"socket_path": str(socket), "mode": "zero_copy", "fallback": True})
    sup = start_supervised(
        sim_args=("-tp", "2", "--load-format", "ipc_cache", "--model-loader-extra-config", loader),
        sup_args=("--preload-command", daemon, "--preload-health", f"http://127.0.0.1:{health_port}/health"),
    )
    try:
        body = sup.wait_for(
            "READY with both daemon ranks found",
            lambda b: b.get("state") == "READY" and len([r for r in b["preload"]["ranks"] if r["pid"]]) == 2,
            40,
        )
        daemon_pid, engine_pid = body["preload"]["pid"], body["engine"]["pid"]
        ranks = body["preload"]["ranks"]
        assert [(r["rank"], r["alive"]) for r in ranks] == [(0, True), (1, True)], ranks
        assert ranks[1]["socket"].endswith("wc.rank1.sock"), ranks  # its "serving on" line, as vLLM logs it
        rank1 = ranks[1]["pid"]

        os.kill(rank1, signal.SIGKILL)
        wait_until(lambda: sup.probe("/readyz")[0] == 503, 10, "readiness withdrawn after a daemon rank died")
        body = sup.wait_for(
            "READY on a new daemon",
            lambda b: b.get("state") == "READY" and b["preload"]["pid"] not in (None, daemon_pid),
            60,
        )
        assert body["engine"]["pid"] not in (None, engine_pid)
        assert load_source(sup.engine_url) == "ipc_cache"
        records = sup.oplog()
        (lost,) = [r for r in records if r["record"] == "preload_rank_lost"]
        assert lost["pid"] == daemon_pid and lost["state"] == "READY", lost
        assert f"preload daemon rank 1 (pid {rank1}) died; ranks still running: [0] of 2" in lost["reason"]
        failed = next(r for r in records if r["record"] == "transition" and r["to"] == "FAILED")
        assert f"preload daemon rank 1 (pid {rank1}) died" in failed["reason"], failed
        assert f"the daemon (pid {daemon_pid}) was stopped" in failed["reason"], failed
        assert body["engine_evidence"]["preload_exit"]["count"] >= 1, body["engine_evidence"]
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)


def test_a_daemon_that_exits_before_it_is_healthy_is_restarted_not_waited_out(tmp_path: Path) -> None:
    """A rank that dies while the daemon loads makes vLLM's launcher exit (its startup loop); the
    supervisor restarts the daemon at once instead of waiting out --dependency-timeout for its /health."""
    socket = short_tmp_dir() / "wc.sock"
    health_port = free_port()
    once = tmp_path / "failed-once"
    script = f"[ -e {once} ] || {{ touch {once}; exit 3; }}; exec {daemon_command(health_port, socket)}"
    loader = json.dumps({"socket_path": str(socket), "mode": "zero_copy", "fallback": True})
    sup = start_supervised(
        sim_args=("--load-format", "ipc_cache", "--model-loader-extra-config", loader),
        sup_args=(
            "--preload-command",
            shlex.join(["sh", "-c", script]),
            "--preload-health",
            f"http://127.0.0.1:{health_port}/health",
            "--dependency-timeout",
            "600",
        ),
    )
    try:
        sup.wait_state("READY", 60)  # well inside the 600 s the gate would have waited
        records = sup.oplog()
        assert [r["exit_code"] for r in records if r["record"] == "preload_exited"] == [3], records
        assert [r["record"] for r in records].count("preload_started") == 2
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)
