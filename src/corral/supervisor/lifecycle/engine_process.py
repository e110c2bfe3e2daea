"""The engine process under supervision: started in its own process group with `[engine]`-prefixed
output, its startup phase read from the lines vLLM logs, and the restart-in-place policy (capped
exponential backoff, a budget, a `RestartRecord` with exit code and last lines for every restart).

The engine's environment is the supervisor's minus Corral's own secrets (`engine_environment`): the
management token, token files and keys are for Corral, never for a process that runs model code.
Its API key and every other secret of its command and environment (`corral.redaction`) are masked in
every output line the supervisor shows or keeps.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from corral.child_process import ChildProcess, LineSink
from corral.engine.flags import engine_api_key
from corral.engine.gpu_faults import GpuFault, GpuFaultLog
from corral.engine.kv_log import EngineLogFigures
from corral.engine.rank_lines import ParallelSize, parallel_size
from corral.engine.weight_cache_log import WeightCacheLog
from corral.redaction import Redactor, secret_values
from corral.supervisor.lifecycle.ranks import EngineRanks
from corral.supervisor.lifecycle.states import StartingPhase
from corral.supervisor.lifecycle.xid_watch import XidWatch

# Corral's own secrets by name (CORRAL_TOKEN, CORRAL_TOKEN_FILE, an admin or API key file, ...).
_CORRAL_SECRET = re.compile(r"^CORRAL_.*(TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)


def engine_environment(
    extra: Mapping[str, str], inherited: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The engine's whole environment: the supervisor's (`inherited`, default os.environ) with `extra`
    (a bundle's env) on top, and no Corral secret from either."""
    merged = {**(os.environ if inherited is None else inherited), **extra}
    return {k: v for k, v in merged.items() if not _CORRAL_SECRET.match(k)}


# vLLM's startup log, in order (as in tests/data/vllm-samples/engine_startup_and_shutdown.log);
# the first marker found in a line wins.
_PHASE_MARKERS: tuple[tuple[str, StartingPhase], ...] = (
    ("Starting vLLM server on", StartingPhase.SERVER_STARTING),
    ("init engine (profile, create kv cache, warmup model) took", StartingPhase.SERVER_STARTING),
    ("Graph capturing finished", StartingPhase.SERVER_STARTING),
    ("Capturing CUDA graph", StartingPhase.CAPTURING_GRAPHS),
    ("Capturing cudagraphs", StartingPhase.CAPTURING_GRAPHS),
    ("Warming up model", StartingPhase.CAPTURING_GRAPHS),
    ("KV cache size", StartingPhase.ALLOCATING_KV_CACHE),
    ("Available KV cache memory", StartingPhase.ALLOCATING_KV_CACHE),
    ("Model loading took", StartingPhase.ALLOCATING_KV_CACHE),
    ("Loading weights took", StartingPhase.LOADING_MODEL),
    ("Starting to load model", StartingPhase.LOADING_MODEL),
)


def detect_phase(line: str) -> StartingPhase | None:
    """The startup phase a vLLM log line announces, or None for any other line."""
    for marker, phase in _PHASE_MARKERS:
        if marker in line:
            return phase
    return None


PhaseListener = Callable[[StartingPhase, str], None]


@dataclass(frozen=True)
class RestartRecord:
    attempt: int
    exit_code: int | None
    reason: str
    last_lines: tuple[str, ...]
    backoff_seconds: float
    time: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "last_lines": list(self.last_lines),
            "backoff_seconds": self.backoff_seconds,
            "time": self.time,
        }


class RestartPolicy:
    """Capped exponential backoff within a budget: `next_backoff()` is None once the budget is spent."""

    def __init__(self, budget: int, initial: float = 1.0, cap: float = 30.0) -> None:
        self.budget = budget
        self.initial = initial
        self.cap = cap
        self.used = 0

    def next_backoff(self) -> float | None:
        if self.used >= self.budget:
            return None
        delay: float = min(self.cap, self.initial * 2.0**self.used)
        self.used += 1
        return delay

    def reset(self) -> None:
        self.used = 0


@dataclass(frozen=True)
class EngineIdentity:
    """What identifies the engine's process across supervisor restarts (pid reuse included)."""

    pid: int
    create_time: float


class EngineProcess:
    """One run of the engine command. A new instance per (re)start keeps each run's lines apart."""

    def __init__(
        self,
        argv: Sequence[str],
        echo: LineSink,
        on_phase: PhaseListener,
        keep_lines: int = 200,
        env: dict[str, str] | None = None,
        xids: XidWatch | None = None,
        on_xid: Callable[[GpuFault], None] | None = None,
    ) -> None:
        self.argv = list(argv)
        self._echo = echo
        self._on_phase = on_phase
        self.phase = StartingPhase.ENGINE_STARTING
        environment = engine_environment(env or {})
        self.api_key = engine_api_key(self.argv, environment)  # what the engine demands of callers
        # its key, and every secret of its command and environment (vLLM prints its non-default args)
        self._redact = Redactor([self.api_key, *secret_values(self.argv, environment)])
        self._last_lines: deque[str] = deque(maxlen=keep_lines)  # masked, as shown
        self.lines_seen = 0  # every line this run wrote, counted: a mark for `lines_since`
        self._child = ChildProcess(
            "engine", self.argv, env=environment, sink=self._line, keep_lines=0, inherit_env=False
        )
        self.identity: EngineIdentity | None = None
        self.log_figures = EngineLogFigures()  # this run's KV size and memory shares, as logged
        self.weight_cache = WeightCacheLog()  # this run's "Mapped N tensors …" lines and disk fallbacks
        self.gpu_faults = GpuFaultLog()  # this run's CUDA/NCCL errors as logged, and the driver's Xids
        self._xids = xids  # opened before the run starts: only what comes after it is read
        self._on_xid = on_xid
        try:
            size = parallel_size(self.argv)
        except ValueError:  # vLLM refuses the command with its own message; one rank meanwhile
            size = ParallelSize()
        self.ranks = EngineRanks(size)  # its worker processes, fed each line below

    def _line(self, line: str) -> None:
        shown = self._redact(line)
        self._last_lines.append(shown)
        self.lines_seen += 1
        self._echo(shown)
        self.ranks.note_line(shown)
        self.log_figures.note(line)
        self.weight_cache.note(shown)
        self.gpu_faults.note_line(shown)
        phase = detect_phase(line)
        if phase is not None and phase is not self.phase:
            self.phase = phase
            self._on_phase(phase, shown)

    async def start(self) -> EngineIdentity:
        await self._child.start()
        pid = self._child.pid
        assert pid is not None
        try:
            create_time = float(psutil.Process(pid).create_time())
        except psutil.Error:  # exited already; the identity is still this run's
            create_time = 0.0
        self.identity = EngineIdentity(pid, create_time)
        self.ranks.attach(pid, create_time)
        return self.identity

    @property
    def pid(self) -> int | None:
        return self._child.pid

    @property
    def running(self) -> bool:
        return self._child.running

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    def named_fault(self) -> GpuFault | None:
        """The fault this run is named by: an Xid the kernel or NVML reported since it started first,
        then the CUDA/NCCL errors it logged (corral.engine.gpu_faults.primary); None when none."""
        if self._xids is not None:
            for xid in self._xids.read():
                self.gpu_faults.note(xid)
                if self._on_xid is not None:
                    self._on_xid(xid)
        return self.gpu_faults.primary

    def gpu_fault(self) -> dict[str, Any] | None:
        """`named_fault` with the count of each kind seen, for /v1/state and a FAILED's evidence."""
        self.named_fault()
        return self.gpu_faults.to_json()

    def xid_sources(self) -> dict[str, Any] | None:
        """Where this run's Xids are read from, and why not from the others (/v1/state)."""
        return self._xids.to_json() if self._xids is not None else None

    def close_xids(self) -> None:
        if self._xids is not None:
            self._xids.close()

    def last_lines(self, n: int = 20) -> tuple[str, ...]:
        return tuple(list(self._last_lines)[-n:])

    def lines_since(self, mark: int) -> tuple[str, ...]:
        """The lines written after `lines_seen` was `mark` (as many as are still kept)."""
        return self.last_lines(self.lines_seen - mark) if self.lines_seen > mark else ()

    async def wait_exit(self) -> int | None:
        """Blocks until the engine exits (no deadline: the callers race it against other events)."""
        code = None
        while code is None and self._child.pid is not None:
            code = await self._child.wait(None)
        return code

    async def stop(self, grace_seconds: float) -> int | None:
        """SIGTERM to the engine's process group; SIGKILL after `grace_seconds`; then SIGKILL to
        whatever of its tree outlived it (a rank that left the group), before anyone starts another."""
        self.ranks.refresh()  # its descendants now, while they can still be found from it
        self.ranks.stopping()  # a rank that exits before its engine now is the stop's, not a loss
        code = await self._child.stop(grace_seconds)
        await self.ranks.reap()
        return code

    def exit_task(self) -> asyncio.Task[int | None]:
        return asyncio.create_task(self.wait_exit(), name="engine-exit")
