"""The rank watch against a real vLLM CPU engine: its worker process is found from vLLM's own log lines
(`(VllmWorker-0 pid=…)`, `(Worker pid=…) … rank 0 in world size 1 …`), and SIGKILL of that worker on a
READY engine fails it at once naming the rank, then RECOVER brings a new worker to READY."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import pytest

from tests.e2e.conftest import SERVED_NAME, vllm_command, vllm_env
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # two engine starts of 40-200 s each


def _state(url: str) -> dict[str, Any]:
    try:
        return dict(httpx.get(url + "/v1/state", timeout=5).json())
    except httpx.HTTPError:
        return {}


def _ready_rank(url: str) -> dict[str, Any] | None:
    body = _state(url)
    ranks = body.get("ranks") or []
    if body.get("state") == "READY" and len(ranks) == 1 and ranks[0]["alive"] is True:
        return dict(ranks[0])
    return None


def test_a_killed_vllm_worker_fails_the_engine_naming_its_rank_and_recover_restarts_it(
    vllm_python: str, tiny_model: Path, tmp_path: Path
) -> None:
    engine_port, supervisor_port = free_port(), free_port()
    url = f"http://127.0.0.1:{supervisor_port}"
    state_dir = tmp_path / "state"
    supervisor = CorralProcess(
        [
            "supervise",
            "--port", str(supervisor_port),
            "--engine-url", f"http://127.0.0.1:{engine_port}",
            "--model", SERVED_NAME,
            "--state-dir", str(state_dir),
            "--startup-timeout", "400",
            "--failure-restarts", "1",
            "--shutdown-timeout", "20",
            "--",
            *vllm_command(vllm_python, tiny_model, engine_port),
        ],
        env=vllm_env(),
    )  # fmt: skip
    try:
        wait_until(lambda: _ready_rank(url) is not None, 400, "READY with its worker rank")
        body = _state(url)
        rank = _ready_rank(url)
        assert rank is not None and body["world_size"] == 1
        assert rank["rank"] == 0 and rank["name"] in ("Worker", "VllmWorker-0")
        worker = rank["pid"]
        assert worker in {p.pid for p in psutil.Process(body["engine"]["pid"]).children(recursive=True)}

        os.kill(worker, signal.SIGKILL)
        wait_until(lambda: _state(url).get("state") != "READY", 60, "the engine out of READY")
        records = [orjson.loads(line) for line in (state_dir / "oplog.jsonl").read_text().splitlines()]
        failed = next(r for r in records if r.get("record") == "transition" and r.get("to") == "FAILED")
        assert failed["reason"].startswith(f"rank 0 ({rank['name']} pid {worker}) died"), failed
        assert failed["evidence"]["source"] == "rank_watch"

        try:
            wait_until(lambda: _ready_rank(url) is not None, 400, "READY again after RECOVER")
        except BaseException:
            print(supervisor.output()[-8000:])
            raise
        again = _ready_rank(url)
        assert again is not None and again["pid"] != worker
    finally:
        supervisor.stop(grace=30)
