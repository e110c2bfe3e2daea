"""`corral supervise --preload-command`: the weight-cache daemon starts first and the engine only once
the daemon is healthy, loading from it (not from disk); an engine restart reuses the same daemon; at
shutdown the engine stops before the daemon. A disk fallback is recorded as engine evidence and counted.
A daemon that dies under a READY engine takes it out of routing at once, is restarted, and the engine
comes back READY from the new daemon; one that keeps dying fails the engine with that reason. Real
processes: `corral sim preload` and `corral sim --load-format ipc_cache`."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from pathlib import Path

from tests.integration.test_sim_preload import load_source
from tests.integration.test_supervisor_support import (
    Supervised,
    gone,
    kill_leftovers,
    short_tmp_dir,
    start_supervised,
)
from tests.support.procs import free_port
from tests.support.prom import sample, scrape
from tests.support.waits import wait_until

FALLBACKS = "corral_supervisor_preload_fallbacks_total"


def daemon_command(health_port: int, socket: Path, *extra: str) -> str:
    """`corral sim preload` serving on `socket`, healthy on `health_port`."""
    command = [sys.executable, "-m", "corral", "sim", "preload", "--model", "sim-model"]
    command += ["--weight-cache-health-port", str(health_port), "--socket-path", str(socket), *extra]
    return shlex.join(command)


def preload_supervised(daemon: str, health_port: int, socket: Path, mode: str, *extra: str) -> Supervised:
    """A supervised sim loading from the daemon (`--load-format ipc_cache` in `mode`, with fallback)."""
    loader = json.dumps({"socket_path": str(socket), "mode": mode, "fallback": True})
    return start_supervised(
        sim_args=("--load-format", "ipc_cache", "--model-loader-extra-config", loader),
        sup_args=(
            "--preload-command",
            daemon,
            "--preload-health",
            f"http://127.0.0.1:{health_port}/health",
            *extra,
        ),
    )


def test_daemon_first_engine_from_it_restart_reuses_it_and_shutdown_order() -> None:
    socket = short_tmp_dir() / "wc.sock"
    health_port = free_port()
    daemon = daemon_command(health_port, socket, "--startup-seconds", "1")
    # zero_copy: the daemon keeps the weights for the next engine (copy mode releases them once copied)
    sup = preload_supervised(daemon, health_port, socket, "zero_copy")
    pids: list[int] = []
    try:
        body = sup.wait_state("READY", 40)
        daemon_pid = body["preload"]["pid"]
        assert body["preload"]["running"] and daemon_pid
        records = [r["record"] for r in sup.oplog()]
        assert records.index("preload_started") < records.index("engine_started")
        assert load_source(sup.engine_url) == "ipc_cache"

        engine_pid = body["engine"]["pid"]
        os.kill(engine_pid, signal.SIGKILL)
        body = sup.wait_for(
            "READY after restart",
            lambda b: b.get("state") == "READY" and b["engine"]["pid"] not in (None, engine_pid),
            40,
        )
        assert body["preload"]["pid"] == daemon_pid and body["preload"]["running"]  # reused
        assert load_source(sup.engine_url) == "ipc_cache", "\n".join(
            line for line in sup.proc.output().splitlines() if "eight" in line or "preload" in line
        )
        assert "fallback" not in (body.get("engine_evidence") or {})
        pids = sup.engine_pids()

        sup.proc.proc.send_signal(signal.SIGTERM)
        sup.proc.proc.wait(timeout=60)
        records = sup.oplog()
        kinds = [r["record"] for r in records]
        last_engine_exit = max(i for i, k in enumerate(kinds) if k == "engine_exited")
        assert kinds.index("preload_stopped") > last_engine_exit, kinds[-8:]
        assert gone(daemon_pid)
    finally:
        sup.proc.stop(grace=20)
        kill_leftovers(pids or sup.engine_pids())


def test_a_disk_fallback_on_restart_is_recorded_as_evidence_and_counted() -> None:
    socket = short_tmp_dir() / "wc.sock"
    health_port = free_port()
    # copy mode: the daemon releases the weights once the first engine copied them, so the restarted
    # engine finds nothing to load and falls back to disk
    sup = preload_supervised(daemon_command(health_port, socket), health_port, socket, "copy")
    try:
        engine_pid = sup.wait_state("READY", 40)["engine"]["pid"]
        assert sample(scrape(sup.url + "/metrics"), FALLBACKS) == 0
        os.kill(engine_pid, signal.SIGKILL)
        body = sup.wait_for(
            "READY after restart",
            lambda b: b.get("state") == "READY" and b["engine"]["pid"] not in (None, engine_pid),
            40,
        )
        assert load_source(sup.engine_url) == "disk_fallback"
        assert body["engine_evidence"]["fallback"]["count"] == 1, body["engine_evidence"]
        assert [r for r in sup.oplog() if r["record"] == "engine_evidence" and r["kind"] == "fallback"]
        assert sample(scrape(sup.url + "/metrics"), FALLBACKS) == 1
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)


def test_daemon_death_takes_the_engine_out_of_routing_and_it_returns_on_a_new_daemon() -> None:
    socket = short_tmp_dir() / "wc.sock"
    health_port = free_port()
    daemon = daemon_command(health_port, socket, "--startup-seconds", "1")
    sup = preload_supervised(daemon, health_port, socket, "zero_copy")
    try:
        body = sup.wait_state("READY", 40)
        daemon_pid, engine_pid = body["preload"]["pid"], body["engine"]["pid"]

        os.kill(daemon_pid, signal.SIGKILL)
        wait_until(lambda: sup.probe("/readyz")[0] == 503, 5, "readiness withdrawn after the daemon died")

        body = sup.wait_for(
            "READY on a new daemon",
            lambda b: (
                b.get("state") == "READY"
                and b["preload"]["running"]
                and b["preload"]["pid"] not in (None, daemon_pid)
            ),
            60,
        )
        assert body["engine"]["pid"] not in (None, engine_pid)  # a fresh engine, not a re-verified one
        assert load_source(sup.engine_url) == "ipc_cache"  # loaded from the new daemon, not from disk
        assert body["engine_evidence"]["preload_exit"]["count"] == 1, body["engine_evidence"]

        records = sup.oplog()
        kinds = [r["record"] for r in records]
        (death,) = [r for r in records if r["record"] == "preload_exited"]
        assert (death["pid"], death["exit_code"], death["state"]) == (daemon_pid, -signal.SIGKILL, "READY")
        failed = next(
            r
            for r in records[kinds.index("preload_exited") :]
            if r["record"] == "transition" and r["to"] == "FAILED"
        )
        assert f"preload daemon (pid {daemon_pid})" in failed["reason"], failed
        restarted = [i for i, r in enumerate(records) if r["record"] == "preload_started"][1]
        assert kinds.index("preload_exited") < records.index(failed) < restarted
        last_engine_start = max(i for i, k in enumerate(kinds) if k == "engine_started")
        assert restarted < last_engine_start  # the new daemon before the new engine
        assert [r["cause"] for r in records if r["record"] == "engine_restart"] == ["preload_exit"]

        metrics = scrape(sup.url + "/metrics")
        assert sample(metrics, "corral_supervisor_preload_exits_total") == 1
        assert sample(metrics, "corral_supervisor_preload_restarts_total") == 1
        assert sample(metrics, "corral_supervisor_engine_restarts_total", cause="preload_exit") == 1
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)


def test_a_daemon_that_keeps_dying_fails_the_engine_with_the_reason(tmp_path: Path) -> None:
    socket = short_tmp_dir() / "wc.sock"
    health_port = free_port()
    started = tmp_path / "started-once"
    # the first run serves; every later one exits at once with code 3
    daemon = shlex.join(
        [
            "sh",
            "-c",
            f"[ -e {started} ] && exit 3; touch {started}; exec {daemon_command(health_port, socket)}",
        ]
    )
    sup = preload_supervised(daemon, health_port, socket, "zero_copy", "--preload-restarts", "2")
    try:
        daemon_pid = sup.wait_state("READY", 40)["preload"]["pid"]
        os.kill(daemon_pid, signal.SIGKILL)
        body = sup.wait_for("FAILED for good", lambda b: b.get("sub_state") == "gave_up", 40)
        assert "preload daemon keeps dying: 2 restarts spent" in body["reason"], body["reason"]
        assert "exited with code 3" in body["reason"], body["reason"]
        assert sup.probe("/readyz")[0] == 503 and sup.probe("/livez")[0] == 503
        assert [r["exit_code"] for r in sup.oplog() if r["record"] == "preload_exited"] == [-9, 3, 3]
        assert sample(scrape(sup.url + "/metrics"), "corral_supervisor_preload_restarts_total") == 2
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)
