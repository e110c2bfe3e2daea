"""The supervisor's settings (`SupervisorConfig`): one frozen value built and checked by the CLI."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from corral.bundle_spec import BundleSpec
from corral.supervisor.checks.dependencies import DependencyGate
from corral.supervisor.lifecycle.drain import DrainSettings
from corral.supervisor.lifecycle.failure_strategy import OnStartupFailure
from corral.supervisor.lifecycle.idle_settings import IdleSleepSettings
from corral.supervisor.lifecycle.memory_checks import MemoryThresholds
from corral.supervisor.precheck.gate import PrecheckSettings
from corral.supervisor_defaults import DEFAULT_UNANSWERED_SECONDS, RESTART_BACKOFF_CAP_SECONDS
from corral.tracing.settings import TracingSettings


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class SupervisorConfig:
    engine_argv: tuple[str, ...]
    engine_url: str = "http://127.0.0.1:8000"
    host: str = "127.0.0.1"
    port: int = 8081
    model: str | None = None
    gates: tuple[DependencyGate, ...] = ()
    dependency_timeout: float = 600.0
    startup_timeout: float = 1800.0
    startup_restarts: int = 3
    failure_restarts: int = 3
    restart_backoff: float = 1.0
    restart_backoff_cap: float = RESTART_BACKOFF_CAP_SECONDS
    stall_seconds: float = 60.0
    # a READY engine whose /health has not answered 200 for this long leaves routing (0: never)
    unanswered_seconds: float = DEFAULT_UNANSWERED_SECONDS
    drain: DrainSettings = field(default_factory=DrainSettings)
    state_dir: Path = Path(".corral-supervisor")
    oplog_max_bytes: int = 64 * 1024 * 1024  # rotated past this size
    oplog_keep: int = 3  # rotated files kept (oplog.jsonl.1 … .N)
    token: str | None = None
    tracing: TracingSettings | None = None  # --otlp-traces-endpoint, OTEL_*: a trace per operation
    gate_host: str = "0.0.0.0"
    gate_port: int | None = None  # the admission gate's data port (corral.supervisor.http.admission)
    preload_argv: tuple[str, ...] = ()  # the weight-cache daemon, started before the engine
    preload_health: str | None = None  # the daemon's health URL (a dependency gate too)
    preload_restarts: int = 3  # restarts of a daemon that died, before the engine is FAILED for good
    lora: tuple[tuple[str, str], ...] = ()  # desired LoRA adapters (name, path), loaded after every start
    engine_env: tuple[tuple[str, str], ...] = ()  # set in the engine's environment (a bundle's env)
    bundle_name: str = "initial"  # what the engine command as configured is called
    bundles: tuple[BundleSpec, ...] = ()  # bundles this host may be switched to (POST /v1/bundle)
    memory: MemoryThresholds = field(default_factory=MemoryThresholds)  # VERIFY's memory thresholds
    # what follows a start that failed for good (lifecycle/failure_strategy.py)
    on_startup_failure: OnStartupFailure = field(default_factory=OnStartupFailure)
    # what PRECHECK expects of every (re)start (corral.supervisor.precheck.gate)
    precheck: PrecheckSettings = field(default_factory=PrecheckSettings)
    # prefill | decode | both (`--role`); None: the engine command's --kv-transfer-config says
    role: str | None = None
    # where the GPU driver's Xids are read (lifecycle/xid_watch.py): a path, "off"; None: /dev/kmsg
    kernel_log: str | None = None
    # --sleep-after-seconds and friends (runbook/idle_sleep.py); after_seconds 0: no idle sleep
    idle_sleep: IdleSleepSettings = field(default_factory=IdleSleepSettings)
