"""A child process Corral owns: its own process group, its output forwarded with a prefix, and a stop
that always ends with the whole group gone (SIGTERM, a deadline, then SIGKILL).

A real vLLM that gets SIGTERM with a request in flight may never exit (see
``tests/data/vllm-samples/README.md``), so no caller waits for a child without a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
from collections import deque
from collections.abc import Callable, Sequence

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: ask the kernel to SIGKILL it if its parent dies first,
    so a `corral` that is itself SIGKILLed leaves no orphan engine behind."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the explicit stop path still applies
        pass


LineSink = Callable[[str], None]


class ChildProcess:
    """One command run in a new session (process group), its stdout+stderr read line by line."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        sink: LineSink | None = None,
        keep_lines: int = 200,
        inherit_env: bool = True,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self._inherit_env = inherit_env  # False: `env` is the child's whole environment
        self._sink = sink
        self.last_lines: deque[str] = deque(maxlen=keep_lines)
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        """Start the command; raises FileNotFoundError/PermissionError if it cannot be executed."""
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **(self.env or {})} if self._inherit_env else dict(self.env or {}),
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self._reader = asyncio.create_task(self._read_output(), name=f"output:{self.name}")

    async def _read_output(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        stream = self._proc.stdout
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than the stream limit: take what is there
                raw = await stream.read(65536)
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip("\n")
            self.last_lines.append(line)
            if self._sink is not None:
                self._sink(line)

    async def wait(self, within: float | None = None) -> int | None:
        """The exit code, or None if the child is still running after `within` seconds."""
        if self._proc is None:
            return None
        try:
            code = await asyncio.wait_for(self._proc.wait(), within)
        except TimeoutError:
            return None
        if self._reader is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reader), 1.0)
        return code

    def send_signal(self, sig: int) -> None:
        """Signal the whole process group (the engine's own workers included)."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    async def stop(self, grace_seconds: float) -> int | None:
        """SIGTERM the group, wait up to `grace_seconds`, then SIGKILL it. Returns the exit code."""
        if self._proc is None:
            return None
        if self._proc.returncode is None:
            self.send_signal(signal.SIGTERM)
            code = await self.wait(grace_seconds)
            if code is not None:
                self.send_signal(signal.SIGKILL)  # stragglers left in the group
                return code
        self.send_signal(signal.SIGKILL)
        return await self.wait(10.0)
