"""The simulator process's life: startup (see `startup`), serving, engine death, and `[shutdown]`.

SIGTERM/SIGINT stop the listener, drain in-flight requests for up to `--shutdown-timeout` seconds, then abort
the rest; like the real server, aborted requests never get an answer and the process waits for their
connections to close before it exits. With `--tensor-parallel-size` N >= 2 the engine has N worker
processes (`executor`); when one dies the engine is dead, as vLLM's is: in-flight requests end with 500,
`/health` answers 503, and after `--engine-dead-exit-seconds` the API server exits 1 (vLLM's watchdog).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable

import zmq
from aiohttp import web
from prometheus_client.registry import Collector

from corral.engine import pd_protocol as pd
from corral.engine.sim_tokenizer import ToyTokenizer
from corral.sim.core.config import SimConfig
from corral.sim.core.control import EngineControl
from corral.sim.core.engine import Engine
from corral.sim.core.kv_transfer import KvTransfers
from corral.sim.core.lifecycle import EngineLifecycle
from corral.sim.core.logs import EngineLog
from corral.sim.core.lora import LoraRegistry
from corral.sim.core.sizing import size_engine
from corral.sim.executor import Executor
from corral.sim.http import dev_api, kv_side_channel, lora_api
from corral.sim.http.app import RouteSet, SimApi
from corral.sim.http.connections import BusyConnections
from corral.sim.http.kv_metrics import KvTransferCollector
from corral.sim.http.kv_side_channel import KvSideChannel
from corral.sim.http.metrics import EngineCollector, MetricsEndpoint
from corral.sim.http.ops_metrics import LifecycleCollector, LoraCollector
from corral.sim.kv_events_publisher import KvEventPublisher
from corral.sim.startup import WEIGHTS_END, WEIGHTS_START, EngineStartup, StartupFailed
from corral.sim.weights.weight_loader import LoadOutcome

_STATS_INTERVAL_S = 10.0
_ENGINE_DEAD = (
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause."
)


class SimServer:
    def __init__(self, config: SimConfig, log: EngineLog | None = None) -> None:
        self.log = log or EngineLog()
        self.sizing = size_engine(config)
        if self.sizing.plan is not None:
            config = dataclasses.replace(config, kv_cache_blocks=self.sizing.plan.num_blocks)
        self.config = config
        self.engine = Engine(config, ToyTokenizer(), self.log)
        self.lifecycle = EngineLifecycle(
            self.sizing.weights_bytes, self.sizing.kv_cache_bytes, config.enable_sleep_mode
        )
        self.control = EngineControl(self.engine, self.lifecycle, self.log)
        self.lora: LoraRegistry | None = None
        if config.enable_lora or config.runtime_lora_updating:
            self.lora = LoraRegistry(
                config.model_name,
                config.enable_lora,
                config.max_loras,
                config.seed,
                config.default_max_tokens,
            )
            self.engine.lora = self.lora
        lifecycle = self.lifecycle
        collector = EngineCollector(
            config.model_name,
            self.engine.stats,
            self.engine.scheduler,
            self.engine.cache,
            sleep_state=lambda: lifecycle.sleep_state_label,
            cache_config=self._cache_config(config),
        )
        self.lifecycle_metrics = LifecycleCollector(
            config.model_name, lifecycle, LoadOutcome("disk"), memory=config.memory_metrics
        )
        extra: list[Collector] = [self.lifecycle_metrics]
        if self.lora is not None and config.enable_lora:
            extra.append(LoraCollector(self.lora))
        addons: list[tuple[RouteSet, dict[str, tuple[str, ...]]]] = []
        if config.dev_mode:
            metrics = self.lifecycle_metrics
            dev = dev_api.DevApi(
                config,
                self.control,
                self.log,
                self._reload_seconds(),
                lambda: dataclasses.asdict(metrics.load),
                self._rank_line,
            )
            addons.append((dev, dev_api.ROUTES))
        self._lora_api: lora_api.LoraApi | None = None
        if config.runtime_lora_updating and self.lora is not None:
            self._lora_api = lora_api.LoraApi(self.lora, self.log, lambda: None, self._on_lora_load)
            addons.append((self._lora_api, lora_api.ROUTES))
        if config.kv_transfer_config is not None:
            kv = self._kv_connector(config)
            addons.append((KvSideChannel(kv), kv_side_channel.ROUTES))
            extra.append(KvTransferCollector(config.model_name, kv, self.engine.stats.created))
        self.api = SimApi(config, self.engine, MetricsEndpoint(collector, *extra), self.lora, addons)
        self.kv_events: KvEventPublisher | None = None
        kv_events, cache_events = config.kv_events, self.engine.cache.events
        if kv_events is not None and cache_events is not None:
            self.kv_events = KvEventPublisher(kv_events, cache_events, self.log)
        self.executor: Executor | None = None
        if config.tensor_parallel_size > 1:
            self.executor = Executor(
                config.tensor_parallel_size, self.log, self._on_rank_death, unlogged=config.unlogged_rank
            )
        self._startup = EngineStartup(
            config,
            self.log,
            self.sizing,
            lora=self.lora,
            warn_runtime_lora=self._lora_api is not None,
            on_loaded=self._on_loaded,
            executor=self.executor,
            bind=self._bind,
        )
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._dead = asyncio.Event()
        self._signals = 0
        self._signal_name = "SIGTERM"

    def _kv_connector(self, config: SimConfig) -> KvTransfers:
        assert config.kv_transfer_config is not None
        parsed = pd.parse_kv_transfer_config(config.kv_transfer_config)
        kv = KvTransfers(
            parsed,
            str(parsed.get("engine_id") or uuid.uuid4()),
            self.engine.scheduler,
            self.sizing.kv_cache_bytes // max(1, config.kv_cache_blocks),
            config.kv_transfer_ms_per_block,
            config.fail_kv_transfer,
            config.hang_kv_transfer,
            config.seed,
        )
        self.engine.kv = kv
        return kv

    def _cache_config(self, config: SimConfig) -> dict[str, str]:
        """This engine's values of `vllm:cache_config_info`'s labels (the block count is read live)."""
        tokens = config.kv_cache_blocks * config.block_size
        return {
            "gpu_memory_utilization": str(config.gpu_memory_utilization),
            "kv_cache_memory_bytes": str(self.sizing.kv_cache_bytes),
            "kv_cache_max_concurrency": str(round(tokens / max(1, config.max_model_len), 2)),
            "prefix_caching_hash_algo": config.prefix_caching_hash_algo,
        }

    def _on_lora_load(self) -> None:
        """`--fail-lora-kv-blocks`: a load shrinks the KV cache (never below one block)."""
        lost = self.config.fail_lora_kv_blocks
        scheduler = self.engine.scheduler
        if lost:
            scheduler.total_blocks = max(1, scheduler.total_blocks - lost)

    def _on_loaded(self, outcome: LoadOutcome) -> None:
        self.lifecycle_metrics.load = outcome

    # -- signals ---------------------------------------------------------------------------------------

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        self._signal_name = sig.name
        if self._signals == 1:
            self._stop.set()
        else:
            self._force.set()

    async def run(self) -> int:
        """Start, serve until a signal or the engine's death, shut down; the process exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        startup = asyncio.create_task(self._startup.run())
        interrupted = asyncio.create_task(self._first(self._stop, self._dead))
        await asyncio.wait({startup, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        interrupted.cancel()
        if not startup.done():
            startup.cancel()
            await asyncio.gather(startup, return_exceptions=True)
            if self._dead.is_set():
                rank = self.executor.dead_rank if self.executor is not None else None
                self._startup.fail(f"RuntimeError: Worker proc VllmWorker-{rank} died during startup.")
                await self._stop_executor()
                return 1
            self.log.info(
                "APIServer",
                "launcher.py:254",
                f"[shutdown] API server: {self._signal_name} during startup, exiting",
            )
            await self._stop_executor()
            return 0
        try:
            startup.result()
        except StartupFailed:
            await self._stop_executor()
            return 1
        self._schedule_rank_failure()
        stats = asyncio.create_task(self._log_stats())
        await self._first(self._stop, self._dead)
        code = await self._shutdown() if self._stop.is_set() else await self._die()
        stats.cancel()
        if self.kv_events is not None:
            await self.kv_events.close()
        return code

    @staticmethod
    async def _first(*events: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _stop_executor(self) -> None:
        if self.executor is not None:
            await self.executor.shutdown()

    # -- engine death ----------------------------------------------------------------------------------

    def _schedule_rank_failure(self) -> None:
        cfg, executor = self.config, self.executor
        if cfg.fail_rank is None or executor is None:
            return
        reason = (
            "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp, unhandled cuda error (run with "
            f"NCCL_DEBUG=INFO for details) (simulated: --fail-rank {cfg.fail_rank} after "
            f"{cfg.fail_rank_after_seconds:g} s)"
        )
        asyncio.get_running_loop().call_later(
            cfg.fail_rank_after_seconds, executor.fail, cfg.fail_rank, reason
        )

    def _on_rank_death(self, rank: int, exit_code: int | None) -> None:
        """A worker died (the executor logged which): the engine core fails and the engine is dead."""
        if self._runner is not None:
            log = self.log
            log.error("EngineCore", "core.py:1036", "EngineCore encountered a fatal error.")
            log.error("EngineCore", "core.py:1036", "RuntimeError: Executor failed.")
            log.error("APIServer", "async_llm.py:566", "AsyncLLM output_handler failed.")
            log.error("APIServer", "async_llm.py:566", _ENGINE_DEAD)
            self.engine.dead = True
            self.control.abort()
        self._dead.set()

    async def _die(self) -> int:
        """The engine died while serving: 503/500 until vLLM's watchdog stops the server, then exit 1."""
        await self._stop_executor()
        if self.config.keep_alive_on_engine_death:
            await self._stop.wait()
        else:
            try:  # a signal cuts the wait short
                await asyncio.wait_for(self._stop.wait(), self.config.engine_dead_exit_seconds)
            except TimeoutError:
                pass
        assert self._runner is not None and self._site is not None
        self.log.plain("INFO:     Shutting down")
        await self._site.stop()
        server = self._runner.server
        assert server is not None
        for conn in list(server.connections):
            conn.force_close()
        self.log.plain("INFO:     Waiting for application shutdown.")
        self.log.plain("INFO:     Application shutdown complete.")
        self.log.plain(f"INFO:     Finished server process [{os.getpid()}]")
        return 1

    def _rank_line(self, rank: int, level: str, where: str, message: str) -> None:
        """A line as worker process `rank` writes it, under its name and pid (TP ≥ 2)."""
        if self.executor is not None:
            self.executor.log_rank(rank, level, where, message)

    def _reload_seconds(self) -> float:
        """How long `reload_weights` takes: reading the checkpoint from disk again."""
        return self.config.startup_seconds * (WEIGHTS_END - WEIGHTS_START)

    async def _bind(self) -> None:
        if self.kv_events is not None:
            try:
                self.kv_events.start()
            except zmq.ZMQError as exc:
                cfg = self.kv_events.config
                where = ", ".join(a for a in (cfg.endpoint, cfg.replay_endpoint) if a)
                self.log.error(
                    "EngineCore",
                    "kv_events.py:430",
                    f"could not open the KV events sockets at {where}: {exc}; give --kv-events-config free "
                    "ports",
                )
                raise StartupFailed(str(exc)) from exc
        runner = web.AppRunner(self.api.build(), handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port, backlog=2048)
        try:
            await site.start()
        except OSError as exc:
            self.log.error(
                "APIServer", "launcher.py:120", f"could not bind {self.config.host}:{self.config.port}: {exc}"
            )
            await runner.cleanup()
            raise StartupFailed(str(exc)) from exc
        self._runner, self._site = runner, site
        kv = self.engine.kv
        if kv is not None:
            wildcard = self.config.host in ("", "0.0.0.0", "::")
            host = self.config.side_channel_host or ("127.0.0.1" if wildcard else self.config.host)
            ports = [addr[1] for addr in runner.addresses if isinstance(addr, tuple)]
            kv.side_channel = (host, ports[0] if ports else self.config.port)

    # -- running ---------------------------------------------------------------------------------------

    async def _log_stats(self) -> None:
        stats = self.engine.stats
        prompt, gen = stats.prompt_tokens, stats.generation_tokens
        while True:
            await asyncio.sleep(_STATS_INTERVAL_S)
            dp, dg = stats.prompt_tokens - prompt, stats.generation_tokens - gen
            prompt, gen = stats.prompt_tokens, stats.generation_tokens
            busy = self.engine.scheduler.num_running or self.engine.scheduler.num_waiting
            if dp or dg or busy:
                self.log.info(
                    "APIServer",
                    "loggers.py:335",
                    self.engine.throughput_line(dp / _STATS_INTERVAL_S, dg / _STATS_INTERVAL_S),
                )

    # -- shutdown --------------------------------------------------------------------------------------

    async def _shutdown(self) -> int:
        log, engine, timeout = self.log, self.engine, self.config.shutdown_timeout
        assert self._runner is not None and self._site is not None
        mode = "wait" if timeout > 0 else "abort"
        log.info("APIServer", "launcher.py:254", "[shutdown] API server: shutdown triggered")
        log.info(
            "APIServer",
            "launcher.py:270",
            f"[shutdown] API server: stopping engine client mode={mode} timeout={timeout:g}s",
        )
        await self._site.stop()  # closes the listening socket only; open connections stay
        server = self._runner.server
        assert server is not None
        server.pre_shutdown()  # idle keep-alive connections close now, busy ones after their response
        if timeout > 0 and engine.inflight:
            await self._drain(timeout)
        log.info(
            "EngineCore",
            "core.py:1454",
            f"[shutdown] EngineCore: trigger received signal={self._signal_name}",
        )
        if engine.inflight:
            log.warning(
                "APIServer",
                "launcher.py:275",
                f"[shutdown] API server: aborting {engine.inflight} in-flight requests",
            )
        engine.abort_all()
        log.info("APIServer", "core_client.py:770", f"[shutdown] MPClient: start timeout={timeout:g}s")
        await self._stop_executor()
        log.info("APIServer", "core_client.py:777", "[shutdown] MPClient: complete")
        log.info("APIServer", "launcher.py:279", "[shutdown] API server: engine client stopped")
        log.info("APIServer", "launcher.py:282", "[shutdown] API server: signalling HTTP server shutdown")
        log.info("APIServer", "launcher.py:304", "[shutdown] API server: shutting down FastAPI HTTP server")
        log.plain("INFO:     Shutting down")
        server.pre_shutdown()
        _close_idle_connections(server, self.api.connections)
        if server.connections:
            log.plain("INFO:     Waiting for connections to close. (CTRL+C to force quit)")
            if not await self._until(lambda: not server.connections, self._force.wait):
                log.plain("INFO:     Force quit")
        log.plain("INFO:     Waiting for application shutdown.")
        log.plain("INFO:     Application shutdown complete.")
        log.plain(f"INFO:     Finished server process [{os.getpid()}]")
        return 0

    async def _drain(self, limit_s: float) -> None:
        engine, log = self.engine, self.log
        deadline = time.monotonic() + limit_s
        next_note = 0.0
        while engine.inflight and time.monotonic() < deadline and not self._force.is_set():
            now = time.monotonic()
            if now >= next_note:
                log.info(
                    "APIServer",
                    "launcher.py:272",
                    f"[shutdown] API server: draining {engine.inflight} "
                    f"in-flight requests, {deadline - now:.1f}s of {limit_s:g}s left",
                )
                next_note = now + 1.0
            await asyncio.sleep(0.02)

    @staticmethod
    async def _until(done: Callable[[], bool], interrupt: Callable[[], Awaitable[bool]]) -> bool:
        """Poll `done` until true (True) or `interrupt` completes first (False)."""
        stopper = asyncio.ensure_future(interrupt())
        try:
            while not done():
                if stopper.done():
                    return False
                await asyncio.sleep(0.05)
            return True
        finally:
            stopper.cancel()


def _close_idle_connections(server: web.Server, busy: BusyConnections) -> None:
    """Close keep-alive connections that carry no request, as uvicorn does at shutdown.

    aiohttp's pre_shutdown() leaves idle keep-alive connections open, and a router's pooled
    connection would then hold the process up forever. Connections whose request was aborted stay
    open, unanswered, which is what the real engine does (see vllm-samples/README.md).
    """
    for conn in list(server.connections):
        if not busy.carries_request(conn):
            conn.force_close()
