"""`corral doctor` names the diagnosis-tree branch for each fault the simulator injects, against a real
supervisor and simulator on loopback (and a router for the membership branch)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.procs import CorralProcess, free_port, start_sim
from tests.support.waits import wait_until


class Supervised:
    def __init__(self, tmp_path: Path, sim_args: list[str], env: dict[str, str] | None = None) -> None:
        port, engine_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.engine_url = f"http://127.0.0.1:{engine_port}"
        sim = [
            sys.executable,
            "-m",
            "corral",
            "sim",
            "--port",
            str(engine_port),
            "--model",
            "sim-model",
            *sim_args,
        ]
        args = ["supervise", "--port", str(port), "--engine-url", self.engine_url, "--model", "sim-model"]
        args += [
            "--state-dir",
            str(tmp_path / "state"),
            "--startup-restarts",
            "0",
            "--restart-backoff",
            "0.1",
        ]
        self.proc = CorralProcess([*args, "--", *sim], env=env)

    def state(self) -> dict[str, object]:
        try:
            body = httpx.get(self.url + "/v1/state", timeout=2).json()
        except httpx.HTTPError:
            return {}
        return dict(body)

    def wait_for(self, state: str) -> None:
        try:
            wait_until(lambda: self.state().get("state") == state, 60, f"supervisor {state}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last state {self.state()}:\n{self.proc.output()[-3000:]}") from None


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[list[Supervised]]:
    started: list[Supervised] = []
    yield started
    for s in started:
        s.proc.stop()


def doctor(*args: str) -> tuple[int, list[str], str]:
    proc = CorralProcess(["doctor", *args], env={"COLUMNS": "200"})
    code = proc.wait_exit(60)
    out = proc.output()
    return code, re.findall(r"^branch [^:]+: (\S+)$", out, re.MULTILINE), out


def start(
    supervised: list[Supervised], tmp_path: Path, *sim_args: str, env: dict[str, str] | None = None
) -> Supervised:
    s = Supervised(tmp_path, list(sim_args), env)
    supervised.append(s)
    return s


def test_a_healthy_engine_has_no_branch(supervised: list[Supervised], tmp_path: Path) -> None:
    s = start(supervised, tmp_path)
    s.wait_for("READY")
    code, branches, out = doctor("--supervisor", s.url)
    assert (code, branches) == (0, ["healthy"]), out


def test_hang(supervised: list[Supervised], tmp_path: Path) -> None:
    s = start(supervised, tmp_path, "--hang-after=1")  # the smoke request passes, every later one hangs
    s.wait_for("READY")
    code, branches, out = doctor("--supervisor", s.url, "--probe-seconds", "1")
    assert (code, branches) == (1, ["requests-failing/hang"]), out


def test_crash_during_startup(supervised: list[Supervised], tmp_path: Path) -> None:
    s = start(supervised, tmp_path, "--crash-after=0")  # exits at the smoke request
    s.wait_for("FAILED")
    code, branches, out = doctor("--supervisor", s.url)
    assert (code, branches) == (1, ["process-dead/startup-crash"]), out


def test_missing_dependency(supervised: list[Supervised], tmp_path: Path) -> None:
    s = start(supervised, tmp_path, f"--requires=file:{tmp_path}/kv.sock")
    s.wait_for("FAILED")
    code, branches, out = doctor("--supervisor", s.url)
    assert (code, branches) == (1, ["not-ready/dependency"]), out
    assert "kv.sock" in out


def test_sleeping(supervised: list[Supervised], tmp_path: Path) -> None:
    s = start(supervised, tmp_path, "--enable-sleep-mode", env={"VLLM_SERVER_DEV_MODE": "1"})
    s.wait_for("READY")
    assert httpx.post(s.engine_url + "/sleep", params={"level": 1}, timeout=10).status_code == 200
    code, branches, out = doctor("--supervisor", s.url)
    assert (code, branches) == (1, ["not-ready/sleeping"]), out
    assert "corral wake --supervisor" in out and "curl" not in out, out  # the runbook's wake


def test_fallback_to_disk(supervised: list[Supervised], tmp_path: Path) -> None:
    loader = orjson.dumps({"socket_path": str(tmp_path / "no-daemon.sock"), "fallback": True}).decode()
    s = start(supervised, tmp_path, "--load-format=ipc_cache", f"--model-loader-extra-config={loader}")
    s.wait_for("READY")
    code, branches, out = doctor("--supervisor", s.url)
    assert (code, branches) == (1, ["preload/fallback-to-disk"]), out


def test_router_still_listing_a_stopped_engine() -> None:
    sim, engine_url = start_sim()
    port = free_port()
    router = CorralProcess(
        ["router", "--port", str(port), "--backend", engine_url, "--models-refresh-seconds", "600"]
    )
    try:
        router.wait_http(f"http://127.0.0.1:{port}/health")
        sim.stop()
        code, branches, out = doctor("--router", f"http://127.0.0.1:{port}")
        assert code == 1, out
        assert "requests-failing/router-lists-dead-engine" in branches, out
    finally:
        router.stop()
        sim.stop()
