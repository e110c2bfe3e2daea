"""The simulated engine's startup: vLLM's log phases spread over `--startup-seconds`, its refusals at the
phase where vLLM reports them, and the worker processes of a tensor-parallel engine.

Order (as vLLM 0.32/0.33 logs it): arguments (a bad one is an APIServer `ValueError`, exit 1), engine
config, workers spawned, model load (a CUDA OOM here when one rank's weights outgrow the simulated device),
`Model loading took`, dependencies, `Available KV cache memory` (then "No available memory for the cache
blocks" / "To serve at least one request ..." when the KV cache cannot hold one `--max-model-len`
sequence), `GPU KV cache size` / `Maximum concurrency`, `init engine`, `Starting vLLM server`, bind. Per-rank
lines come from each worker process (`Worker_TP{i}`), or from `Worker` in this process when TP is 1.
With `--load-format ipc_cache` the weights come from a preload daemon and the weight-loading part of the
startup (45% of it) is skipped; a disk fallback takes the full time (see `weight_loader`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable

from corral.sim.core.config import GIB, SimConfig
from corral.sim.core.device import format_gib
from corral.sim.core.logs import EngineLog
from corral.sim.core.lora import LoraRegistry, parse_lora_module
from corral.sim.core.requests import RequestError
from corral.sim.core.sizing import EngineSizing, default_max_model_len
from corral.sim.executor import Executor
from corral.sim.weights.requires import Requirement
from corral.sim.weights.weight_cache import cache_key, default_fingerprint
from corral.sim.weights.weight_loader import IpcLoadConfig, LoadOutcome, WeightLoader

WEIGHTS_START, WEIGHTS_END = 0.15, 0.6  # the share of --startup-seconds spent loading weights
_ARGS_SHOWN = (
    "host",
    "port",
    "model",
    "served_model_name",
    "max_model_len",
    "max_num_seqs",
    "block_size",
    "seed",
    "shutdown_timeout",
    "enable_sleep_mode",
    "load_format",
    "enable_lora",
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "dtype",
    "kv_cache_dtype",
    "revision",
    "tokenizer_revision",
    "code_revision",
    "quantization",
    "enforce_eager",
)


class StartupFailed(Exception):
    """Engine init failed; the message has been logged."""


class EngineStartup:
    """One run of the startup sequence, ending with the port bound (or `StartupFailed`)."""

    def __init__(
        self,
        config: SimConfig,
        log: EngineLog,
        sizing: EngineSizing,
        *,
        lora: LoraRegistry | None,
        warn_runtime_lora: bool,
        on_loaded: Callable[[LoadOutcome], None],
        executor: Executor | None,
        bind: Callable[[], Awaitable[None]],
    ) -> None:
        self.config = config
        self.log = log
        self.sizing = sizing
        self.lora = lora
        self.warn_runtime_lora = warn_runtime_lora
        self.on_loaded = on_loaded
        self.executor = executor
        self.bind = bind

    def fail(self, root_cause: str) -> StartupFailed:
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

    def _rank_line(self, where: str, message: str) -> None:
        """A line every rank logs: from each worker process, or from this one without workers."""
        if self.executor is not None:
            self.executor.log_each("INFO", where, message)
        else:
            self.log.info("Worker", where, message)

    def _check_config(self) -> IpcLoadConfig | None:
        """Refuse settings vLLM refuses (before anything loads); the ipc_cache loader settings if any."""
        cfg = self.config
        ipc: IpcLoadConfig | None = None
        try:
            if self.sizing.config_error is not None:
                raise ValueError(self.sizing.config_error)
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
            raise self.fail(f"{type(exc).__name__}: {exc}") from exc

    async def _load_static_loras(self) -> None:
        if self.lora is None:
            return
        for spec in self.config.lora_modules:
            name, path = parse_lora_module(spec)
            try:
                self.lora.load(name, path)
            except RequestError as exc:
                raise self.fail(f"ValueError: {exc.message}") from exc
            self.log.info(
                "APIServer", "serving.py:226", f"Loaded new LoRA adapter: name '{name}', path '{path}'"
            )

    async def _check_requirements(self) -> None:
        for spec in self.config.requires:
            req = Requirement.parse(spec)
            self.log.info("EngineCore", "factory.py:64", f"Creating KV connector for dependency {spec}")
            problem = await req.check()
            if problem is not None:
                raise self.fail(
                    f"ConnectionError: KV cache connector could not reach "
                    f"required dependency {spec!r} ({problem}). Start it first, or remove --requires."
                )

    def _log_args(self) -> None:
        cfg, log = self.config, self.log
        defaults = SimConfig()
        non_default = {k: getattr(cfg, k) for k in _ARGS_SHOWN if getattr(cfg, k) != getattr(defaults, k)}
        if cfg.max_model_len == default_max_model_len(cfg.model):  # derived from config.json, not given
            non_default.pop("max_model_len", None)
        if cfg.served_model_name is not None:
            non_default["served_model_name"] = [cfg.served_model_name]
        if cfg.api_key:  # vLLM prints its args, the key among them (the env variable is not an arg)
            non_default["api_key"] = list(cfg.api_key)
        if cfg.model_loader_extra_config:  # as vLLM: the parsed JSON, credentials and all
            try:
                non_default["model_loader_extra_config"] = json.loads(cfg.model_loader_extra_config)
            except ValueError:
                non_default["model_loader_extra_config"] = cfg.model_loader_extra_config
        log.info("APIServer", "api_utils.py:347", f"vLLM API server version {cfg.version_string} (simulated)")
        log.info("APIServer", "api_utils.py:286", f"non-default args: {non_default}")
        log.info("APIServer", "model.py:2152", f"Using max model len {cfg.max_model_len}")

    async def run(self) -> None:
        cfg, log, sizing = self.config, self.log, self.sizing
        began = time.monotonic()
        skipped = 0.0

        async def at(fraction: float) -> None:
            delay = began + cfg.startup_seconds * fraction - skipped - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

        self._log_args()
        ipc = self._check_config()
        await at(0.1)
        log.info(
            "EngineCore",
            "core.py:133",
            f"Initializing a V1 LLM engine (v{cfg.version_string}) with config: "
            f"model='{cfg.model}', served_model_name={cfg.model_name}, max_seq_len={cfg.max_model_len}, "
            f"tensor_parallel_size={cfg.tensor_parallel_size}, seed={cfg.seed}, "
            f"enable_prefix_caching=True, block_size={cfg.block_size}",
        )
        if self.executor is not None:
            await self.executor.start()
        await at(WEIGHTS_START)
        self._rank_line("gpu_model_runner.py:3112", f"Starting to load model {cfg.model}...")
        load_began = time.monotonic()
        outcome = await self._load_weights(ipc)
        self.on_loaded(outcome)
        failure = sizing.memory_error
        if outcome.from_daemon:
            skipped = max(
                0.0, cfg.startup_seconds * (WEIGHTS_END - WEIGHTS_START) - (time.monotonic() - load_began)
            )
        else:
            await at(WEIGHTS_END if failure is None or not failure.during_load else 0.4)
            if failure is not None and failure.during_load:
                raise self.fail(str(failure))
            self._rank_line(
                "default_loader.py:501", f"Loading weights took {time.monotonic() - load_began:.2f} seconds"
            )
        self._rank_line(
            "gpu_model_runner.py:3191",
            f"Model loading took {sizing.weights_bytes / GIB:.4f} GiB memory and "
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
        await self._size_kv_cache()
        await at(0.95)
        log.info(
            "EngineCore",
            "core.py:402",
            f"init engine (profile, create kv cache, warmup model) took {cfg.startup_seconds * 0.85:.2f} s",
        )
        await at(1.0)
        if self.warn_runtime_lora:
            log.warning(
                "APIServer",
                "api_router.py:31",
                "LoRA dynamic loading & unloading is enabled in the API server. "
                "This should ONLY be used for local development!",
            )
        log.info("APIServer", "entry.py:140", f"Starting vLLM server on http://{cfg.host}:{cfg.port}")
        await self.bind()
        log.plain(f"INFO:     Started server process [{os.getpid()}]")
        log.plain("INFO:     Waiting for application startup.")
        log.plain("INFO:     Application startup complete.")

    async def _size_kv_cache(self) -> None:
        cfg, sizing = self.config, self.sizing
        failure = sizing.memory_error
        if failure is not None:
            if failure.available_kv_bytes is not None:
                self._rank_line(
                    "gpu_worker.py:298",
                    f"Available KV cache memory: {format_gib(failure.available_kv_bytes)} GiB",
                )
            raise self.fail(str(failure))
        plan = sizing.plan
        assert plan is not None
        if plan.available_kv_bytes is not None:
            available = format_gib(plan.available_kv_bytes)
        else:
            available = f"{plan.kv_cache_bytes / GIB:.2f}"
        self._rank_line("gpu_worker.py:298", f"Available KV cache memory: {available} GiB")
        self.log.info(
            "EngineCore", "kv_cache_utils.py:1087", f"GPU KV cache size: {plan.kv_cache_tokens:,} tokens"
        )
        self.log.info(
            "EngineCore",
            "kv_cache_utils.py:1091",
            f"Maximum concurrency for {cfg.max_model_len:,} tokens per request: {plan.max_concurrency:.2f}x",
        )
