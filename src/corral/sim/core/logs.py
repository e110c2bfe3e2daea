"""vLLM-shaped log lines on stdout: `(APIServer pid=N) INFO 12-02 09:43:19 [file.py:line] message`.

Supervisors grep these phases (model load, KV cache size, `Starting vLLM server`, `[shutdown]`), so the
simulator prints the same ones; every line is flushed at once so a reader sees it when it happens. As
vLLM, it prints only lines at or above `VLLM_LOGGING_LEVEL` (default INFO): under WARNING the INFO lines
(phases, `Mapped N tensors …`) are not there to read.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

_LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}


class EngineLog:
    """Writes log lines tagged with the vLLM process they would come from (APIServer, EngineCore, Worker)."""

    def __init__(self, stream: TextIO | None = None, level: str | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._pid = os.getpid()
        wanted = (level or os.environ.get("VLLM_LOGGING_LEVEL") or "INFO").upper()
        self._threshold = _LEVELS.get(wanted, _LEVELS["INFO"])

    def line(self, level: str, proc: str, where: str, message: str, pid: int | None = None) -> None:
        """One line; `pid` names another process of the engine (a worker) whose line this process writes."""
        if _LEVELS.get(level, _LEVELS["INFO"]) < self._threshold:
            return
        stamp = time.strftime("%m-%d %H:%M:%S")
        self._stream.write(f"({proc} pid={pid or self._pid}) {level} {stamp} [{where}] {message}\n")
        self._stream.flush()

    def info(self, proc: str, where: str, message: str) -> None:
        self.line("INFO", proc, where, message)

    def warning(self, proc: str, where: str, message: str) -> None:
        self.line("WARNING", proc, where, message)

    def error(self, proc: str, where: str, message: str) -> None:
        self.line("ERROR", proc, where, message)

    def plain(self, message: str) -> None:
        """A uvicorn-style line (`INFO:     Started server process [N]`)."""
        self._stream.write(message + "\n")
        self._stream.flush()
