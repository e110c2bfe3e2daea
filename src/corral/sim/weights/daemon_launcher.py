"""`corral sim preload`: vLLM's `vllm preload` launcher (entrypoints/cli/preload.py), one rank process per
GPU (TP × DP here) and the parent's `/health`.

As vLLM's: the parent starts the ranks, answers `/health` 503 until every rank serves its socket, then
200 while every rank process lives (503 again as soon as one has exited), and logs
`===== Weight cache daemon READY: node 0/1 serving N local rank(s) x 1 role(s) in DIR =====` once. A rank
that dies does not take the others down; the parent exits once every rank has (with the highest exit
code), or on SIGTERM/SIGINT after terminating them. Each rank is `python -m
corral.sim.weights.daemon_rank CONFIG`, its lines on the daemon's stdout; rank r > 0 serves its own
socket (vLLM names one per GPU, by the GPU's UUID), `PATH.rankR.sock` here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
from typing import Any

import orjson
from aiohttp import web

from corral.sim.core.logs import EngineLog
from corral.sim.weights.preload import DaemonConfig, ready_line


def rank_socket(path: str, rank: int) -> str:
    if rank == 0:
        return path
    stem = path[: -len(".sock")] if path.endswith(".sock") else path
    return f"{stem}.rank{rank}.sock"


class DaemonLauncher:
    def __init__(self, config: DaemonConfig, ranks: int, log: EngineLog | None = None) -> None:
        self.config = config
        self.ranks = ranks
        self.log = log or EngineLog()
        self._procs: list[asyncio.subprocess.Process] = []
        self._serving: set[int] = set()
        self._ready = False
        self._stop = asyncio.Event()

    @property
    def healthy(self) -> bool:
        return self._ready and all(p.returncode is None for p in self._procs)

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _start_rank(self, rank: int) -> tuple[asyncio.subprocess.Process, int]:
        """The rank's process and the read end of the pipe it reports readiness on."""
        read_end, write_end = os.pipe()
        cfg = dataclasses.replace(
            self.config,
            rank=rank,
            socket_path=rank_socket(self.config.socket_path, rank),
            health_port=None,
            standalone=False,
            ready_fd=write_end,
        )
        body = orjson.dumps(dataclasses.asdict(cfg)).decode()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "corral.sim.weights.daemon_rank",
                body,
                stdout=asyncio.subprocess.PIPE,
                pass_fds=(write_end,),
            )
        finally:
            os.close(write_end)
        return proc, read_end

    async def _await_ready(self, rank: int, read_end: int) -> None:
        """READY once every rank reported that it serves: a byte on its pipe (b"" if it died first),
        as vLLM's ranks put themselves on a queue, whatever VLLM_LOGGING_LEVEL hides."""
        try:
            said = await asyncio.get_running_loop().run_in_executor(None, os.read, read_end, 1)
        finally:
            os.close(read_end)
        if said and not self._ready:
            self._serving.add(rank)
            if len(self._serving) == self.ranks:
                self._ready = True
                self.log.info(
                    "WeightCache", "preload.py:327", ready_line(self.ranks, self.config.socket_dir_arg)
                )

    async def _relay(self, rank: int, proc: asyncio.subprocess.Process, read_end: int) -> None:
        """The rank's lines on the daemon's stdout (as vLLM's ranks write to the daemon's)."""
        assert proc.stdout is not None
        ready = asyncio.create_task(self._await_ready(rank, read_end))
        async for raw in proc.stdout:
            self.log.plain(raw.decode(errors="replace").rstrip("\n"))
        await proc.wait()
        await ready
        if not self._ready and not self._stop.is_set():
            codes = [p.returncode for p in self._procs if p.returncode is not None]
            self.log.error(
                "WeightCache",
                "preload.py:300",
                f"Weight cache daemon rank(s) exited during startup (exitcodes={codes}); shutting down.",
            )
            self._stop.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        runner: web.AppRunner | None = None
        if self.config.health_port is not None:
            app = web.Application()
            app.router.add_get("/health", self._health, allow_head=False)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, self.config.health_host, self.config.health_port).start()
        try:
            started = [await self._start_rank(r) for r in range(self.ranks)]
            self._procs = [proc for proc, _ in started]
            relays: asyncio.Future[Any] = asyncio.gather(
                *(self._relay(r, proc, read_end) for r, (proc, read_end) in enumerate(started))
            )
            stop: asyncio.Future[Any] = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait([relays, stop], return_when=asyncio.FIRST_COMPLETED)
            if stop.done():
                self.log.info("WeightCache", "preload.py:283", "Weight cache daemon shutting down")
                for proc in self._procs:
                    with contextlib.suppress(ProcessLookupError):
                        proc.terminate()
                await relays
            stop.cancel()
            # as vLLM's launcher: a rank ended by a signal (-N, ours on a stop) counts 0 (max(-15): exit 241)
            return max((max(p.returncode or 0, 0) for p in self._procs), default=0)
        finally:
            for proc in self._procs:
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            if runner is not None:
                await runner.cleanup()
