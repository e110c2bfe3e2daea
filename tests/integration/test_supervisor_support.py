"""Helpers for the supervisor's integration tests (no tests here): start `corral supervise` over a
`corral sim`, read its probes and its operation log, and never leave an engine behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.support.procs import CorralProcess, free_port


def http_json(
    url: str,
    method: str = "GET",
    body: dict[str, Any] | None = None,
    token: str | None = None,
    timeout: float = 5.0,
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("content-type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def short_tmp_dir() -> Path:
    """Unix socket paths must stay under ~108 bytes, so not under pytest's long tmp_path."""
    return Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))


@dataclass
class Supervised:
    proc: CorralProcess
    url: str
    engine_url: str
    state_dir: Path

    def state(self) -> dict[str, Any]:
        return http_json(self.url + "/v1/state")[1]

    def probe(self, path: str) -> tuple[int, dict[str, Any]]:
        return http_json(self.url + path)

    def oplog(self) -> list[dict[str, Any]]:
        path = self.state_dir / "oplog.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def transitions(self) -> list[dict[str, Any]]:
        return [r for r in self.oplog() if r["record"] == "transition"]

    def engine_pids(self) -> list[int]:
        return [r["pid"] for r in self.oplog() if r["record"] == "engine_started"]

    def wait_for(self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if self.proc.proc.poll() is not None:
                raise AssertionError(f"supervisor exited {self.proc.proc.returncode}:\n{self.proc.output()}")
            with contextlib.suppress(OSError):
                body = self.state()
                if check(body):
                    return body
            time.sleep(0.1)
        raise AssertionError(f"not {what} after {timeout}s; last state {body}:\n{self.proc.output()[-6000:]}")

    def wait_state(self, state: str, timeout: float = 30.0) -> dict[str, Any]:
        return self.wait_for(state, lambda b: b.get("state") == state, timeout)

    def quiet_for(self, seconds: float, epoch: int) -> None:
        """Return once the supervisor itself says nothing happened for `seconds` since `epoch`: the
        heartbeat line of its state watch, which it writes only after `seconds` without any other line.
        Its own event loop measured that time, so a restart or any transition it would have made within
        it came first, however slow the machine (and fails this); a sleep in the test measures nothing
        of the kind. Reads no router's subscription (no router_id)."""
        url = f"{self.url}/v1/state/watch?heartbeat={seconds:g}"
        with urllib.request.urlopen(url, timeout=seconds + 30) as resp:
            for raw in resp:
                line = json.loads(raw)
                if line.get("epoch") != epoch:
                    raise AssertionError(f"the supervisor moved on from epoch {epoch}: {line}")
                if line.get("type") == "heartbeat":
                    return
        raise AssertionError(f"the state watch ended before {seconds:g}s passed quietly")


def sim_command(port: int, *args: str, model: str = "sim-model") -> list[str]:
    return [
        sys.executable,
        "-m",
        "corral",
        "sim",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        model,
        *args,
    ]


def start_supervised(
    sim_args: tuple[str, ...] = (),
    sup_args: tuple[str, ...] = (),
    state_dir: Path | None = None,
    engine_port: int | None = None,
    port: int | None = None,
    env: dict[str, str] | None = None,
    engine_cmd: list[str] | None = None,
) -> Supervised:
    port = port or free_port()
    engine_port = engine_port or free_port()
    state_dir = state_dir or short_tmp_dir() / "state"
    engine_url = f"http://127.0.0.1:{engine_port}"
    cmd = engine_cmd or sim_command(engine_port, *sim_args)
    proc = CorralProcess(
        [
            "supervise",
            "--port",
            str(port),
            "--engine-url",
            engine_url,
            "--state-dir",
            str(state_dir),
            "--restart-backoff",
            "0.2",
            *sup_args,
            "--",
            *cmd,
        ],
        env=env,
    )
    sup = Supervised(proc, f"http://127.0.0.1:{port}", engine_url, state_dir)
    proc.wait_http(sup.url + "/livez")
    return sup


def kill_leftovers(pids: list[int]) -> None:
    """Teardown: whatever a failing test left running (engine groups) goes."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@contextlib.contextmanager
def supervised(**kwargs: Any) -> Iterator[Supervised]:
    sup = start_supervised(**kwargs)
    try:
        yield sup
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)
