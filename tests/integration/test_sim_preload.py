"""`corral sim preload` (the weight-cache daemon) and `corral sim --load-format ipc_cache`: daemon health and
READY line, an engine that skips the weight load, a fallback to disk with vLLM's warning, a mismatch or a
missing daemon that is fatal without fallback, and zero_copy refused with sleep mode. Real processes."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import CorralProcess, free_port
from tests.support.waits import http_status, wait_until

READY = "===== Weight cache daemon READY: "
FALLBACK = "); falling back to disk loading"


def start_daemon(socket: Path, *extra: str, model: str = "m") -> tuple[CorralProcess, str]:
    port = free_port()
    proc = CorralProcess(
        [
            "sim",
            "preload",
            "--model",
            model,
            "--weight-cache-health-port",
            str(port),
            "--socket-path",
            str(socket),
            *extra,
        ]
    )
    return proc, f"http://127.0.0.1:{port}/health"


def engine(socket: Path, *extra: str, **loader: object) -> tuple[CorralProcess, str]:
    port = free_port()
    config = json.dumps({"socket_path": str(socket), **loader})
    args = ["sim", "--port", str(port), "--model", "m", "--startup-seconds", "2"]
    proc = CorralProcess([*args, "--load-format", "ipc_cache", "--model-loader-extra-config", config, *extra])
    return proc, f"http://127.0.0.1:{port}"


def load_source(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("corral_sim_weight_load{"):
            return line.split('source="')[1].split('"')[0]
    raise AssertionError("corral_sim_weight_load missing")


@pytest.fixture
def ready_daemon(tmp_path: Path) -> Iterator[Path]:
    socket = tmp_path / "wc.sock"
    proc, health = start_daemon(socket, "--startup-seconds", "0.5")
    try:
        proc.wait_http(health, timeout=20)
        yield socket
    finally:
        proc.stop()


def test_daemon_health_is_503_while_loading_then_200_with_the_ready_line(tmp_path: Path) -> None:
    socket = tmp_path / "wc.sock"
    proc, health = start_daemon(socket, "--startup-seconds", "2")
    try:
        wait_until(lambda: http_status(health) is not None, 10, "daemon health port")
        assert http_status(health) == 503 and not socket.exists()
        proc.wait_http(health, timeout=20)
        assert socket.exists()
        # the log line is the contract: vLLM writes it so, and the supervisor and operators read it
        assert READY in proc.output() and f"in {tmp_path} =====" in proc.output()
        assert proc.stop() == 0
        assert not socket.exists()
    finally:
        proc.stop()


def test_engine_starts_from_the_daemon_without_the_disk_load(ready_daemon: Path) -> None:
    proc, url = engine(ready_daemon, mode="zero_copy", fallback=False)
    try:
        proc.wait_http(url + "/health", timeout=30)
        out = proc.output()
        # the log lines are the contract: vLLM writes them so, and the supervisor and operators read them
        assert "Mapped 291 tensors from the weight cache daemon (zero_copy mode)" in out
        assert "Loading weights took" not in out and FALLBACK not in out
        assert load_source(url) == "ipc_cache"
    finally:
        proc.stop()


def test_missing_daemon_falls_back_to_disk_with_the_warning(tmp_path: Path) -> None:
    proc, url = engine(tmp_path / "nobody.sock")
    try:
        proc.wait_http(url + "/health", timeout=30)
        out = proc.output()
        # the log lines are the contract: vLLM writes them so, and the supervisor and operators read them
        assert "Weight cache unusable (" in out and FALLBACK in out
        assert "Loading weights took" in out
        assert load_source(url) == "disk_fallback"
    finally:
        proc.stop()


def test_daemon_still_loading_means_fallback(tmp_path: Path) -> None:
    socket = tmp_path / "wc.sock"
    daemon, health = start_daemon(socket, "--startup-seconds", "60")
    try:
        wait_until(lambda: http_status(health) == 503, 10, "daemon loading")
        proc, url = engine(socket)
        try:
            proc.wait_http(url + "/health", timeout=30)
            assert load_source(url) == "disk_fallback"
        finally:
            proc.stop()
    finally:
        daemon.stop()


def test_fingerprint_mismatch_without_fallback_fails_the_start(tmp_path: Path) -> None:
    socket = tmp_path / "wc.sock"
    daemon, health = start_daemon(socket, "--startup-seconds", "0", "--fingerprint", "other-revision")
    try:
        daemon.wait_http(health, timeout=20)
        proc, _ = engine(socket, fallback=False)
        try:
            assert proc.wait_exit(timeout=30) == 1
            out = proc.output()
            # the log lines are the contract: vLLM writes them so, and the supervisor and operators read them
            assert "CacheConfigMismatch: WeightCacheKey mismatch on fields: ['fingerprint']" in out
            assert "Engine core initialization failed" in out and "Starting vLLM server" not in out
        finally:
            proc.stop()
        proc, url = engine(socket)  # the same mismatch with fallback: a disk load and the warning
        try:
            proc.wait_http(url + "/health", timeout=30)
            assert FALLBACK in proc.output() and load_source(url) == "disk_fallback"
        finally:
            proc.stop()
    finally:
        daemon.stop()


def test_missing_daemon_without_fallback_fails_after_state_timeout(tmp_path: Path) -> None:
    proc, _ = engine(tmp_path / "nobody.sock", fallback=False, state_timeout_s=1)
    try:
        assert proc.wait_exit(timeout=30) == 1
        out = proc.output()
        # the log lines are the contract: vLLM writes them so, and the supervisor and operators read them
        assert "Waiting up to 1.0s for the weight cache daemon to start" in out
        assert "did not become ready within 1.0s" in out
    finally:
        proc.stop()


def test_zero_copy_with_sleep_mode_is_refused(tmp_path: Path) -> None:
    proc, _ = engine(tmp_path / "wc.sock", "--enable-sleep-mode", mode="zero_copy")
    try:
        assert proc.wait_exit(timeout=15) == 1
        # the log line is the contract: vLLM writes it so, and the supervisor and operators read it
        assert "--enable-sleep-mode cannot be combined" in proc.output()
    finally:
        proc.stop()


def test_unknown_loader_keys_are_refused(tmp_path: Path) -> None:
    proc, _ = engine(tmp_path / "wc.sock", colour="blue")
    try:
        assert proc.wait_exit(timeout=15) == 1
        # the log line is the contract: vLLM writes it so, and the supervisor and operators read it
        assert "Unexpected extra config keys for load format ipc_cache: ['colour']" in proc.output()
    finally:
        proc.stop()
