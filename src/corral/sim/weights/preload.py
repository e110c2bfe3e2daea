"""The simulated weight-cache daemon rank: one GPU's share of vLLM's `vllm preload`, serving the socket
protocol of `weight_cache` (`corral.sim.weights.daemon_launcher` starts one per rank, as vLLM's launcher
does, and answers `/health`).

A rank loads "from disk" over `--startup-seconds`, logs `Weight cache target daemon rank R loaded model`
and `… serving on PATH` once its socket is bound, serves until SIGTERM/SIGINT (or, started by a launcher,
until the launcher is gone), and removes its socket on the way out. Run alone (`standalone`, as the unit
tests do) it also answers `/health` and logs the READY line itself. `--fingerprint` overrides the key it
holds, to stand in for another revision.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from corral.sim.core.config import GIB
from corral.sim.core.logs import EngineLog
from corral.sim.weights.weight_cache import SIM_GPU_UUID, mismatched_fields, recv_msg, send_msg

_TENSORS = 291  # what a small Llama exports


@dataclass(frozen=True)
class DaemonConfig:
    model: str
    socket_path: str
    fingerprint: str
    socket_dir_arg: str | None = None
    health_host: str = "127.0.0.1"
    health_port: int | None = None
    startup_seconds: float = 2.0
    weights_bytes: int = GIB
    rank: int = 0
    standalone: bool = True  # False: a launcher's rank (no health, no READY line, gone with the launcher)
    ready_fd: int | None = None  # a launcher's rank writes one byte here once it serves (vLLM: a queue)


def ready_line(ranks: int, socket_dir: str | None) -> str:
    """vLLM's launcher line once every local rank serves (entrypoints/cli/preload.py)."""
    where = socket_dir or "the default socket dir"
    return (
        f"===== Weight cache daemon READY: node 0/1 serving {ranks} local rank(s) x 1 role(s) "
        f"in {where} ====="
    )


class WeightCacheDaemon:
    def __init__(self, config: DaemonConfig, log: EngineLog | None = None) -> None:
        self.config = config
        self.log = log or EngineLog()
        self.ready = False
        self.released = False
        self._stop = asyncio.Event()

    @property
    def key(self) -> dict[str, str]:
        return {"model": self.config.model, "fingerprint": self.config.fingerprint}

    # -- health ----------------------------------------------------------------------------------------

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def _start_health(self) -> web.AppRunner | None:
        cfg = self.config
        if cfg.health_port is None:
            return None
        app = web.Application()
        app.router.add_get("/health", self._health, allow_head=False)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, cfg.health_host, cfg.health_port).start()
        return runner

    # -- socket ----------------------------------------------------------------------------------------

    async def _answer(self, request: Any) -> dict[str, Any]:
        cmd = request.get("cmd") if isinstance(request, dict) else None
        if cmd == "get_state":
            theirs = request.get("cache_config")
            if not isinstance(theirs, dict):
                return {"status": "error", "message": "Missing cache_config"}
            fields = mismatched_fields(self.key, theirs)
            if fields:
                self.log.warning(
                    "WeightCache", "daemon.py:439", f"WeightCacheKey mismatch on fields: {fields}"
                )
                return {"status": "mismatch", "fields": fields}
            if self.released:
                return {"status": "error", "message": "Weights were released"}
            self.log.info(
                "WeightCache",
                "daemon.py:457",
                f"Weight cache target daemon rank {self.config.rank} sent {_TENSORS} tensors to engine",
            )
            return {"status": "ok", "entries": _TENSORS, "gpu_uuid": SIM_GPU_UUID}
        if cmd == "get_memory":
            return {"status": "ok", "memory_bytes": 0 if self.released else self.config.weights_bytes}
        if cmd == "release":
            self.released = True
            self.log.info(
                "WeightCache",
                "daemon.py:468",
                f"Weight cache target daemon rank {self.config.rank} released cached weights",
            )
            return {"status": "ok"}
        return {"status": "error", "message": f"Unknown command {cmd!r}"}

    async def _serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await send_msg(writer, await self._answer(await recv_msg(reader)))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            self.log.warning("WeightCache", "daemon.py:373", "Client disconnected mid-request")
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    # -- life ------------------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    async def _until_stopped_or_orphaned(self, every: float = 0.2) -> None:
        """A launcher's rank ends with it: its parent gone (SIGKILL), the rank is reparented."""
        parent = os.getppid()
        while not self._stop.is_set() and os.getppid() == parent:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), every)

    async def run(self, handle_signals: bool = True) -> int:
        cfg, log = self.config, self.log
        if handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
        health = await self._start_health()
        server: asyncio.Server | None = None
        try:
            log.info("WeightCache", "preload.py:160", f"Weight cache daemon loading {cfg.model} from disk")
            load = asyncio.create_task(asyncio.sleep(cfg.startup_seconds))
            stop = asyncio.create_task(self._stop.wait())
            await asyncio.wait({load, stop}, return_when=asyncio.FIRST_COMPLETED)
            if stop.done():
                load.cancel()
                return 0
            stop.cancel()
            gib = cfg.weights_bytes / GIB
            log.info(
                "WeightCache",
                "daemon.py:296",
                f"Weight cache target daemon rank {cfg.rank} loaded model ({gib:.2f} GiB allocated, "
                f"{gib:.2f} GiB reserved)",
            )
            os.makedirs(os.path.dirname(cfg.socket_path) or ".", mode=0o700, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(cfg.socket_path)
            server = await asyncio.start_unix_server(self._serve_client, cfg.socket_path)
            os.chmod(cfg.socket_path, 0o600)
            log.info(
                "WeightCache",
                "daemon.py:357",
                f"Weight cache target daemon rank {cfg.rank} serving on {cfg.socket_path}",
            )
            self.ready = True
            if cfg.ready_fd is not None:
                os.write(cfg.ready_fd, b"r")
                os.close(cfg.ready_fd)
            if cfg.standalone:
                log.info("WeightCache", "preload.py:327", ready_line(1, cfg.socket_dir_arg))
                await self._stop.wait()
            else:
                await self._until_stopped_or_orphaned()
            log.info("WeightCache", "preload.py:283", "Weight cache daemon shutting down")
            return 0
        finally:
            self.ready = False
            if server is not None:
                server.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(cfg.socket_path)
            if health is not None:
                await health.cleanup()
