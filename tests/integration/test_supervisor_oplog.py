"""The operation log across supervisor restarts: a supervisor that dies (SIGKILL) and leaves its
engine running is followed by one that finds the engine by PID, start time and process group and
kills it before starting its own — never two engines — and whose epochs continue the old ones."""

from __future__ import annotations

import shlex
import signal
import sys

import psutil

from tests.integration.test_supervisor_support import (
    gone,
    kill_leftovers,
    short_tmp_dir,
    sim_command,
    start_supervised,
    supervised,
)
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_http_200, wait_until


def test_leftover_engine_is_killed_and_epochs_continue() -> None:
    state_dir = short_tmp_dir() / "state"
    engine_port = free_port()
    # The engine runs as a shell's child, so the kernel's parent-death signal (which reaches only the
    # shell) does not take it down with a SIGKILLed supervisor: the leftover a crash can leave.
    wrapped = ["/bin/sh", "-c", shlex.join(sim_command(engine_port)) + " & wait"]
    first = start_supervised(state_dir=state_dir, engine_port=engine_port, engine_cmd=wrapped)
    leftover: list[int] = []
    try:
        body = first.wait_state("READY", timeout=30)
        last_epoch = body["epoch"]
        shell_pid = first.engine_pids()[0]
        leftover = [p.pid for p in psutil.Process(shell_pid).children(recursive=True)]
        assert leftover
        first.proc.proc.send_signal(signal.SIGKILL)
        first.proc.wait_exit(timeout=10)
        # the parent-death signal took the shell; a signal meant for the engine would have come with it,
        # so an answer from the engine after the shell is gone shows it outlived its supervisor
        wait_until(lambda: gone(shell_pid), 10, "the engine's shell to die with the supervisor")
        wait_http_200(f"http://127.0.0.1:{engine_port}/health", 10)
        assert not any(gone(pid) for pid in leftover)  # the engine outlived its supervisor

        with supervised(state_dir=state_dir, engine_port=engine_port) as second:
            body = second.wait_state("READY", timeout=30)
            assert all(gone(pid) for pid in leftover)
            killed = [r for r in second.oplog() if r["record"] == "engine_exited" and r.get("leftover")]
            assert killed and set(leftover) <= set(killed[-1]["killed_pids"])
            # the log line is the contract: the operator's notice of what happened
            assert "from a previous supervisor: killed" in second.proc.output()
            epochs = [t["epoch"] for t in second.transitions()]
            assert epochs == sorted(set(epochs))
            restarted = [t for t in second.transitions() if t["epoch"] > last_epoch]
            assert restarted and restarted[0]["from"] is None  # the new supervisor's first event

            # one supervisor per state dir: a second one is refused before it starts anything
            other = CorralProcess(
                [
                    "supervise",
                    "--port",
                    str(free_port()),
                    "--state-dir",
                    str(state_dir),
                    "--",
                    sys.executable,
                    "-m",
                    "corral",
                    "sim",
                    "--port",
                    str(free_port()),
                ]
            )
            assert other.wait_exit(timeout=30) == 2
            out = other.output()
            other.stop()
            assert "in use by another supervisor" in out and "[engine]" not in out
    finally:
        first.proc.stop()
        kill_leftovers(first.engine_pids())
        for pid in leftover:
            if not gone(pid):
                psutil.Process(pid).kill()
