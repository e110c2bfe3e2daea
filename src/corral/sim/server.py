"""The simulator process's life: vLLM-like startup phases, dependency checks, serving, and `[shutdown]`.

Startup prints vLLM's phases spread over `--startup-seconds` and binds the port only when "loaded", so
until then connections are refused. A `--requires` dependency that is absent fails engine init (exit 1).
With `--load-format ipc_cache` the weights come from a preload daemon and the weight-loading part of the
startup (45% of it) is skipped; a disk fallback takes the full time (see `weight_loader`).
SIGTERM/SIGINT stop the listener, drain in-flight requests for up to `--shutdown-timeout` seconds, then abort
the rest; like the real server, aborted requests never get an answer and the process waits for their
connections to close before it exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client.registry import Collector

from corral.sim.core.config import GIB, SimConfig
from corral.sim.core.control import EngineControl
from corral.sim.core.engine import Engine
from corral.sim.core.lifecycle import EngineLifecycle
from corral.sim.core.logs import EngineLog
from corral.sim.core.lora import LoraRegistry, parse_lora_module
from corral.sim.core.requests import RequestError
from corral.sim.core.tokenizer import ToyTokenizer
from corral.sim.http import dev_api, lora_api
from corral.sim.http.app import RouteSet, SimApi
from corral.sim.http.connections import BusyConnections
from corral.sim.http.metrics import EngineCollector, MetricsEndpoint
from corral.sim.http.ops_metrics import LifecycleCollector, LoraCollector
from corral.sim.weights.requires import Requirement
from corral.sim.weights.weight_cache import cache_key, default_fingerprint
from corral.sim.weights.weight_loader import IpcLoadConfig, LoadOutcome, WeightLoader

_STATS_INTERVAL_S = 10.0
_WEIGHTS_START, _WEIGHTS_END = 0.15, 0.6  # the share of --startup-seconds spent loading weights


class StartupFailed(Exception):
    """Engine init failed; the message has been logged."""


class SimServer:
    def __init__(self, config: SimConfig, log: EngineLog | None = None) -> None:
        self.config = config
        self.log = log or EngineLog()
        self.engine = Engine(config, ToyTokenizer(), self.log)
        self.lifecycle = EngineLifecycle(
            config.weights_bytes, config.kv_cache_bytes, config.enable_sleep_mode
        )
        self.control = EngineControl(self.engine, self.lifecycle, self.log)
        self.lora: LoraRegistry | None = None
        if config.enable_lora or config.runtime_lora_updating:
            self.lora = LoraRegistry(
                config.model, config.enable_lora, config.max_loras, config.seed, config.default_max_tokens
            )
            self.engine.lora = self.lora
        lifecycle = self.lifecycle
        collector = EngineCollector(
            config.model,
            self.engine.stats,
            self.engine.scheduler,
            self.engine.cache,
            sleep_state=lambda: lifecycle.sleep_state_label,
        )
        self.lifecycle_metrics = LifecycleCollector(
            config.model, lifecycle, LoadOutcome("disk"), memory=config.memory_metrics
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
            )
            addons.append((dev, dev_api.ROUTES))
        self._lora_api: lora_api.LoraApi | None = None
        if config.runtime_lora_updating and self.lora is not None:
            self._lora_api = lora_api.LoraApi(self.lora, self.log, lambda: None)
            addons.append((self._lora_api, lora_api.ROUTES))
        self.api = SimApi(config, self.engine, MetricsEndpoint(collector, *extra), self.lora, addons)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._signals = 0
        self._signal_name = "SIGTERM"

    # -- signals ---------------------------------------------------------------------------------------

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        self._signal_name = sig.name
        if self._signals == 1:
            self._stop.set()
        else:
            self._force.set()

    async def run(self) -> int:
        """Start, serve until a signal, shut down; the process exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        startup = asyncio.create_task(self._start())
        stop = asyncio.create_task(self._stop.wait())
        await asyncio.wait({startup, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not startup.done():
            startup.cancel()
            self.log.info(
                "APIServer",
                "launcher.py:254",
                f"[shutdown] API server: {self._signal_name} during startup, exiting",
            )
            return 0
        stop.cancel()
        try:
            startup.result()
        except StartupFailed:
            return 1
        stats = asyncio.create_task(self._log_stats())
        await self._stop.wait()
        code = await self._shutdown()
        stats.cancel()
        return code

    def _reload_seconds(self) -> float:
        """How long `reload_weights` takes: reading the checkpoint from disk again."""
        return self.config.startup_seconds * (_WEIGHTS_END - _WEIGHTS_START)

    # -- startup ---------------------------------------------------------------------------------------

    def _fail(self, root_cause: str) -> StartupFailed:
        log = self.log
        log.error("EngineCore", "core.py:1028", "EngineCore failed to start.")
        log.error("EngineCore", "core.py:1028", root_cause)
        log.error(
            "APIServer",
            "core_client.py:612",
            "RuntimeError: Engine core initialization failed. "
            "See root cause above. Failed core proc(s): {'EngineCore': 1}",
        )
        return StartupFailed(root_cause)

    def _check_config(self) -> IpcLoadConfig | None:
        """Refuse settings vLLM refuses (before anything loads); the ipc_cache loader settings if any."""
        cfg = self.config
        ipc: IpcLoadConfig | None = None
        try:
            if cfg.load_format == "ipc_cache":
                ipc = IpcLoadConfig.parse(cfg.model_loader_extra_config)
                if ipc.mode == "zero_copy" and cfg.enable_sleep_mode:
                    raise ValueError(
                        "--enable-sleep-mode cannot be combined with --load-format ipc_cache in zero_copy "
                        "mode: the weights live in the preload daemon's IPC allocations, which sleep mode "
                        "cannot offload or free. Use mode 'copy' or drop --enable-sleep-mode."
                    )
            if cfg.lora_modules and not cfg.enable_lora:
                raise ValueError("--lora-modules needs --enable-lora.")
        except ValueError as exc:
            self.log.error("APIServer", "arg_utils.py:1890", f"ValueError: {exc}")
            raise StartupFailed(str(exc)) from exc
        return ipc

    async def _load_weights(self, ipc: IpcLoadConfig | None) -> LoadOutcome:
        if ipc is None:
            return LoadOutcome("disk")
        cfg = self.config
        key = cache_key(cfg.model, default_fingerprint(cfg.model, cfg.version_string))
        try:
            return await WeightLoader(ipc, key, self.log).load()
        except Exception as exc:
            raise self._fail(f"{type(exc).__name__}: {exc}") from exc

    async def _load_static_loras(self) -> None:
        if self.lora is None:
            return
        for spec in self.config.lora_modules:
            name, path = parse_lora_module(spec)
            try:
                self.lora.load(name, path)
            except RequestError as exc:
                raise self._fail(f"ValueError: {exc.message}") from exc
            self.log.info(
                "APIServer", "serving.py:226", f"Loaded new LoRA adapter: name '{name}', path '{path}'"
            )

    async def _start(self) -> None:
        cfg, log = self.config, self.log
        began = time.monotonic()
        skipped = 0.0

        async def at(fraction: float) -> None:
            delay = began + cfg.startup_seconds * fraction - skipped - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

        ipc = self._check_config()

        defaults = SimConfig()
        non_default = {
            k: getattr(cfg, k)
            for k in (
                "host",
                "port",
                "model",
                "max_model_len",
                "max_num_seqs",
                "block_size",
                "seed",
                "shutdown_timeout",
                "enable_sleep_mode",
                "load_format",
                "enable_lora",
            )
            if getattr(cfg, k) != getattr(defaults, k)
        }
        if cfg.api_key:  # vLLM prints its args, the key among them (the env variable is not an arg)
            non_default["api_key"] = list(cfg.api_key)
        log.info("APIServer", "api_utils.py:347", f"vLLM API server version {cfg.version_string} (simulated)")
        log.info("APIServer", "api_utils.py:286", f"non-default args: {non_default}")
        log.info("APIServer", "model.py:2152", f"Using max model len {cfg.max_model_len}")
        await at(0.1)
        log.info(
            "EngineCore",
            "core.py:133",
            f"Initializing a V1 LLM engine (v{cfg.version_string}) with config: "
            f"model='{cfg.model}', max_seq_len={cfg.max_model_len}, seed={cfg.seed}, "
            f"enable_prefix_caching=True, block_size={cfg.block_size}",
        )
        await at(_WEIGHTS_START)
        log.info("Worker", "gpu_model_runner.py:3112", f"Starting to load model {cfg.model}...")
        load_began = time.monotonic()
        outcome = await self._load_weights(ipc)
        self.lifecycle_metrics.load = outcome
        if outcome.from_daemon:
            skipped = max(
                0.0, cfg.startup_seconds * (_WEIGHTS_END - _WEIGHTS_START) - (time.monotonic() - load_began)
            )
        else:
            await at(_WEIGHTS_END)
            log.info(
                "Worker",
                "default_loader.py:501",
                f"Loading weights took {time.monotonic() - load_began:.2f} seconds",
            )
        log.info(
            "Worker",
            "gpu_model_runner.py:3191",
            f"Model loading took {cfg.weights_gib:.4f} GiB memory and "
            f"{time.monotonic() - load_began:.6f} seconds",
        )
        log.info(
            "APIServer",
            "loader.py:54",
            f"(simulated) weights loaded via {outcome.source}"
            + (f" ({outcome.mode} mode)" if outcome.mode else ""),
        )
        await self._load_static_loras()
        await at(0.65)
        await self._check_requirements()
        await at(0.75)
        kv_gib = cfg.kv_cache_bytes / GIB
        log.info("Worker", "gpu_worker.py:298", f"Available KV cache memory: {kv_gib:.2f} GiB")
        log.info("EngineCore", "kv_cache_utils.py:1087", f"GPU KV cache size: {cfg.kv_cache_tokens:,} tokens")
        log.info(
            "EngineCore",
            "kv_cache_utils.py:1091",
            f"Maximum concurrency for {cfg.max_model_len:,} tokens "
            f"per request: {cfg.kv_cache_tokens / cfg.max_model_len:.2f}x",
        )
        await at(0.95)
        log.info(
            "EngineCore",
            "core.py:402",
            f"init engine (profile, create kv cache, warmup model) took {cfg.startup_seconds * 0.85:.2f} s",
        )
        await at(1.0)
        if self._lora_api is not None:
            log.warning(
                "APIServer",
                "api_router.py:31",
                "LoRA dynamic loading & unloading is enabled in the API server. "
                "This should ONLY be used for local development!",
            )
        log.info("APIServer", "entry.py:140", f"Starting vLLM server on http://{cfg.host}:{cfg.port}")
        await self._bind()
        log.plain(f"INFO:     Started server process [{os.getpid()}]")
        log.plain("INFO:     Waiting for application startup.")
        log.plain("INFO:     Application startup complete.")

    async def _check_requirements(self) -> None:
        for spec in self.config.requires:
            req = Requirement.parse(spec)
            self.log.info("EngineCore", "factory.py:64", f"Creating KV connector for dependency {spec}")
            problem = await req.check()
            if problem is not None:
                raise self._fail(
                    f"ConnectionError: KV cache connector could not reach "
                    f"required dependency {spec!r} ({problem}). Start it first, or remove --requires."
                )

    async def _bind(self) -> None:
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
