"""Real processes on loopback for integration tests: start `corral ...`, wait until it answers, stop it.

Every process runs in its own process group and is killed with its children at teardown, so a
failing test never leaves an orphan behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from corral.fleet.local import ports


def free_port() -> int:
    """A loopback port for a child to listen on, outside the kernel's ephemeral range (see `ports`)."""
    return ports.free_port("127.0.0.1")


class CorralProcess:
    """One `python -m corral <args>` child, its output kept in a log file for failure reports."""

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.log = Path(tempfile.mkstemp(prefix="corral-test-", suffix=".log")[1])
        self._log_fh = self.log.open("wb")
        full_env = {**os.environ, **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "corral", *self.args],
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        self._log_fh.flush()
        return self.log.read_text(errors="replace")

    def wait_http(self, url: str, timeout: float = 30.0, expect: int = 200) -> None:
        """Poll `url` until it answers `expect`; fail with the process output if it never does."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"corral {' '.join(self.args)} exited {self.proc.returncode}:\n{self.output()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=1.0) as resp:
                    if resp.status == expect:
                        return
                    last = f"status {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"status {exc.code}"
                if exc.code == expect:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
                last = repr(exc)
            time.sleep(0.1)
        raise AssertionError(f"{url} not {expect} after {timeout}s ({last}):\n{self.output()}")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self, grace: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # children left in the group, if any
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        self._log_fh.close()
        return self.proc.returncode


def start_sim(
    port: int | None = None, *extra: str, model: str = "sim-model", wait: bool = True
) -> tuple[CorralProcess, str]:
    port = port or free_port()
    proc = CorralProcess(["sim", "--host", "127.0.0.1", "--port", str(port), "--model", model, *extra])
    url = f"http://127.0.0.1:{port}"
    if wait:
        proc.wait_http(url + "/health")
    return proc, url
