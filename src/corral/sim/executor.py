"""The simulated engine's multiproc executor: one `corral.sim.worker` child per tensor-parallel rank, their
liveness, and the rank death that kills the engine, as vLLM's `MultiprocExecutor` has them.

Each worker's stdin is a pipe only this process writes: commands go down it, and its EOF (at shutdown or
when this process dies, even by SIGKILL) makes the worker exit, so no worker outlives the engine. The
executor awaits every worker's exit; one that exits while the engine runs is a rank death, reported once
through `on_death(rank, exit_code)` within the event loop's reaction to SIGCHLD (milliseconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable

from corral.sim.core.logs import EngineLog
from corral.sim.worker import worker_name

_EXIT_WAIT_S = 5.0  # how long shutdown waits for a worker to exit before killing it

DeathListener = Callable[[int, int | None], None]


class Executor:
    def __init__(
        self, world_size: int, log: EngineLog, on_death: DeathListener, unlogged: int | None = None
    ) -> None:
        self.world_size = world_size
        self.unlogged = unlogged  # this rank logs nothing (`--unlogged-rank`)
        self.log = log
        self._on_death = on_death
        self._procs: list[asyncio.subprocess.Process] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False
        self.dead_rank: int | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    async def start(self) -> None:
        """Spawn every rank and wait until each has logged its rank assignment (its READY), as vLLM's
        executor waits for its workers before the model loads. A rank that dies first is reported
        through `on_death`."""
        ready_fds = []
        for rank in range(self.world_size):
            ready_read, ready_write = os.pipe()
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "corral.sim.worker",
                    "--rank",
                    str(rank),
                    "--world-size",
                    str(self.world_size),
                    "--ready-fd",
                    str(ready_write),
                    *(("--quiet",) if rank == self.unlogged else ()),
                    stdin=asyncio.subprocess.PIPE,
                    pass_fds=(ready_write,),
                )
            finally:
                os.close(ready_write)
            ready_fds.append(ready_read)
            self._procs.append(proc)
            self._watchers.append(asyncio.create_task(self._watch(rank, proc)))
        await asyncio.gather(*(_read_to_eof(fd) for fd in ready_fds))

    async def _watch(self, rank: int, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if self._stopping or self.dead_rank is not None:
            return
        self.dead_rank = rank
        self.log.error(
            "EngineCore",
            "multiproc_executor.py:231",
            f"Worker proc VllmWorker-{rank} died unexpectedly, shutting down executor.",
        )
        self._on_death(rank, code)

    def _send(self, rank: int, command: dict[str, object]) -> None:
        stdin = self._procs[rank].stdin
        if stdin is None or stdin.is_closing():
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            stdin.write(json.dumps(command).encode() + b"\n")

    def log_each(self, level: str, where: str, message: str) -> None:
        """Log `message` once per rank under that worker's name and pid (vLLM's per-rank lines: model
        loading, KV memory). Written here rather than by the worker, so they keep their place among the
        engine's lines."""
        for rank, proc in enumerate(self._procs):
            if rank == self.unlogged:
                continue
            self.log.line(level, worker_name(rank, self.world_size), where, message, pid=proc.pid)

    def log_rank(self, rank: int, level: str, where: str, message: str) -> None:
        """Log `message` under one worker's name and pid (a line only that rank writes, such as the
        exception of a collective RPC that failed in it)."""
        pid = self._procs[rank].pid if rank < len(self._procs) else None
        self.log.line(level, worker_name(rank, self.world_size), where, message, pid=pid)

    def fail(self, rank: int, reason: str) -> None:
        """Make one rank fail as a crashed worker does (`--fail-rank`): it logs `reason` and exits 1."""
        self._send(rank, {"die": reason})

    async def shutdown(self) -> None:
        """Stop every worker: close their pipes, wait for them to exit, kill what lingers."""
        if self._stopping:
            return
        self._stopping = True
        alive = [p for p in self._procs if p.returncode is None]
        if alive and self.dead_rank is None:
            self.log.info(
                "EngineCore",
                "multiproc_executor.py:429",
                f"[shutdown] Executor: waiting for worker exit count={len(alive)}",
            )
        for proc in self._procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in alive:
            try:
                await asyncio.wait_for(proc.wait(), _EXIT_WAIT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for task in self._watchers:
            task.cancel()


async def _read_to_eof(fd: int) -> bytes:
    """Everything a worker writes to its ready pipe (READY, then close; nothing when it died first)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    try:
        return await reader.read()
    finally:
        transport.close()
