"""A tensor-parallel simulator: one worker process per rank, and a rank's death handled as vLLM's multiproc
executor handles it (the engine dies: /health 503, requests 500, exit 1), with no process left behind."""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import psutil

from tests.support.procs import CorralProcess, free_port, start_sim


def _workers(proc: CorralProcess, count: int, timeout: float = 15) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [
            p for p in psutil.Process(proc.pid).children() if "corral.sim.worker" in " ".join(p.cmdline())
        ]
        if len(found) == count:
            return sorted(found, key=lambda p: p.cmdline()[p.cmdline().index("--rank") + 1])
        time.sleep(0.05)
    raise AssertionError(f"not {count} workers after {timeout}s:\n{proc.output()}")


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _until(cond: Callable[[], bool], timeout: float, what: str, proc: CorralProcess) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} not seen within {timeout}s:\n{proc.output()}")


def _gone(procs: list[psutil.Process], timeout: float = 10) -> bool:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return not alive


def test_tp2_runs_two_worker_processes_that_stop_with_the_engine() -> None:
    proc, _ = start_sim(None, "--tensor-parallel-size", "2")
    try:
        workers = _workers(proc, 2)
        out = proc.output()
        for rank, w in enumerate(workers):
            # the log lines are the contract: vLLM writes them so, and the supervisor and operators read them
            assert f"(Worker_TP{rank} pid={w.pid})" in out
            assert f"rank {rank} in world size 2 is assigned as DP rank 0, PP rank 0" in out
            assert re.search(rf"\(Worker_TP{rank} pid={w.pid}\) INFO .* Model loading took", out)
        assert out.index("is assigned as") < out.index("Starting to load model")
        proc.signal(signal.SIGTERM)
        assert proc.wait_exit(timeout=15) == 0
        assert _gone(workers)
        out = proc.output()
        assert "[shutdown] Executor: waiting for worker exit count=2" in out
        assert "WorkerProc shutting down." in out
        assert "died unexpectedly" not in out
    finally:
        proc.stop()


def test_killing_one_rank_kills_the_engine_naming_the_rank() -> None:
    proc, url = start_sim(None, "-tp", "2", "--engine-dead-exit-seconds", "3")
    try:
        workers = _workers(proc, 2)
        assert _status(url + "/health") == 200
        workers[1].send_signal(signal.SIGKILL)
        _until(lambda: _status(url + "/health") == 503, 5, "/health 503", proc)
        body = json.dumps({"model": "sim-model", "prompt": "hi"}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=5)
            raise AssertionError("a request to a dead engine was answered")
        except urllib.error.HTTPError as exc:
            assert exc.code == 500
            assert "EngineCore encountered an issue" in json.loads(exc.read())["error"]["message"]
        assert proc.wait_exit(timeout=15) == 1
        out = proc.output()
        # the log lines are the contract: vLLM writes them so, and the supervisor and operators read them
        assert "Worker proc VllmWorker-1 died unexpectedly, shutting down executor." in out
        assert "EngineDeadError" in out
        assert _gone(workers)
    finally:
        proc.stop()


def test_fail_rank_makes_that_rank_fail_after_serving_starts() -> None:
    args = (
        "-tp",
        "2",
        "--fail-rank",
        "0",
        "--fail-rank-after-seconds",
        "1",
        "--engine-dead-exit-seconds",
        "0",
    )
    proc, _ = start_sim(None, *args, wait=False)
    try:
        workers = _workers(proc, 2)
        assert proc.wait_exit(timeout=15) == 1
        out = proc.output()
        # the log lines are the contract: vLLM writes them so, and the supervisor and operators read them
        assert out.index("Starting vLLM server") < out.index("NCCL error")
        assert f"(Worker_TP0 pid={workers[0].pid}) ERROR" in out
        assert "Worker proc VllmWorker-0 died unexpectedly" in out
        assert _gone(workers)
    finally:
        proc.stop()


def test_workers_never_outlive_a_killed_engine() -> None:
    proc, _ = start_sim(None, "-tp", "2")
    try:
        workers = _workers(proc, 2)
        proc.proc.send_signal(signal.SIGKILL)  # the engine only: its workers must notice on their own
        proc.wait_exit(timeout=10)
        assert _gone(workers)
    finally:
        proc.stop()


def test_a_rank_dying_during_startup_fails_engine_init() -> None:
    proc, _ = start_sim(None, "-tp", "2", "--startup-seconds", "4", wait=False)
    try:
        workers = _workers(proc, 2)
        workers[0].send_signal(signal.SIGKILL)
        assert proc.wait_exit(timeout=15) == 1
        out = proc.output()
        # the log lines are the contract: vLLM writes them so, and the supervisor and operators read them
        assert "Worker proc VllmWorker-0 died unexpectedly" in out
        assert "Engine core initialization failed" in out
        assert "Starting vLLM server" not in out
        assert _gone(workers)
    finally:
        proc.stop()


def test_keep_alive_on_engine_death_keeps_answering_503_until_stopped() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = CorralProcess(
        ["sim", "--port", str(port), "-tp", "2", "--engine-dead-exit-seconds", "0"],
        env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"},
    )
    try:
        proc.wait_http(url + "/health")
        workers = _workers(proc, 2)
        workers[1].send_signal(signal.SIGKILL)
        _until(lambda: _status(url + "/health") == 503, 5, "/health 503", proc)
        # the survivor reaped: the executor has stopped, and without the variable the exit would follow
        # at once (--engine-dead-exit-seconds 0); an answer after that shows it stayed up
        assert _gone(workers)
        assert _status(url + "/health") == 503 and proc.proc.poll() is None
        proc.signal(signal.SIGTERM)
        assert proc.wait_exit(timeout=10) == 1
        assert _gone(workers)
    finally:
        proc.stop()
