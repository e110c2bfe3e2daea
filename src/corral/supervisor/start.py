"""What `corral supervise run` does with its flags (corral.supervisor.cli holds them): check them
(bad input is one line on stderr and exit code 2, before anything is started), then run PRECHECK's
explanation or the supervisor itself."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from corral.aio import run as run_on_uvloop
from corral.bundle_spec import BundleError, BundleSpec, load_bundle
from corral.gate_spec import GateSpecError
from corral.redaction import refused_flag
from corral.state_home import corral_state_dir, state_dir_problem
from corral.supervisor.checks.adapters import AdapterSpecError, parse_lora
from corral.supervisor.checks.dependencies import DependencyGate, parse_gate
from corral.supervisor.commands.bad_input import bad_input, read_token
from corral.supervisor.commands.precheck import explain_precheck, precheck_settings
from corral.supervisor.lifecycle.config import SupervisorConfig, is_loopback
from corral.supervisor.lifecycle.drain import DrainPolicy, DrainSettings
from corral.supervisor.lifecycle.failure_strategy import (
    OnStartupFailure,
    StrategyError,
    check_rollback_bundle,
    parse_on_startup_failure,
)
from corral.supervisor.lifecycle.idle_settings import IdleSleepSettings
from corral.supervisor.lifecycle.memory_checks import MemoryThresholds
from corral.supervisor.lifecycle.pd_role import kv_transfer_problem
from corral.supervisor.serve import serve
from corral.tracing.flag import settings_from_flag


def _default_state_dir(port: int) -> Path:
    return corral_state_dir() / f"supervise-{port}"


def _check_engine_command(argv: tuple[str, ...]) -> None:
    if not argv:
        bad_input("no engine command: put it after `--`, e.g. `-- vllm serve MODEL --port 8000`")
    exe = argv[0]
    if os.sep in exe:
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            bad_input(f"engine command {exe!r} is not an executable file")
    elif shutil.which(exe) is None:
        bad_input(f"engine command {exe!r} not found on PATH")
    refused = refused_flag(argv)
    if refused is not None:
        flag, instead = refused
        bad_input(f"engine command: {flag} with a value is refused: {instead}")


def _parse_gates(specs: tuple[str, ...]) -> tuple[DependencyGate, ...]:
    try:
        return tuple(parse_gate(s) for s in specs)
    except GateSpecError as exc:
        bad_input(str(exc))


def start_supervisor(
    host: str,
    port: int,
    engine_url: str,
    model: str | None,
    wait_for: tuple[str, ...],
    dependency_timeout: float,
    startup_timeout: float,
    startup_restarts: int,
    failure_restarts: int,
    restart_backoff: float,
    stall_seconds: float,
    unanswered_seconds: float,
    sleep_after_seconds: float,
    sleep_level: int,
    sleep_mode: str,
    sleep_peers: tuple[str, ...],
    sleep_last_awake: bool,
    sleep_residue_gib: float,
    wake_tolerance: float,
    drain_policy: str,
    propagation_timeout: float,
    quiet_period: float,
    drain_timeout: float,
    drain_transfer_wait: float,
    shutdown_timeout: float,
    state_dir: Path | None,
    oplog_max_bytes: int,
    oplog_keep: int,
    token_file: Path | None,
    gate_port: int | None,
    gate_host: str,
    preload_command: str | None,
    preload_health: str | None,
    preload_restarts: int,
    lora: tuple[str, ...],
    bundle_files: tuple[Path, ...],
    bundle_name: str,
    on_startup_failure: str,
    role: str | None,
    kernel_log: str | None,
    engine_command: tuple[str, ...],
    otlp_traces_endpoint: str | None = None,
    **precheck_flags: Any,
) -> None:
    """The supervisor the flags describe, checked, then served until it stops."""
    gates = _parse_gates(wait_for)
    engine_host = urlsplit(engine_url).hostname or ""
    if gate_port is not None and not is_loopback(engine_host):
        bad_input(
            f"--gate-port needs the engine on loopback (its dev endpoints must be unreachable from outside); "
            f"--engine-url {engine_url} is not"
        )
    preload_argv: tuple[str, ...] = ()
    if preload_command is not None:
        preload_argv = tuple(shlex.split(preload_command))
        if not preload_argv or not preload_health:
            bad_input("--preload-command needs a command and --preload-health URL (the daemon's /health)")
        if "ipc_cache" not in " ".join(engine_command):
            bad_input("--preload-command: the engine command must load from it (--load-format ipc_cache)")
        gates = (*gates, *_parse_gates((preload_health,)))
    try:
        adapters = tuple(parse_lora(spec) for spec in lora)
    except AdapterSpecError as exc:
        bad_input(str(exc))
    _check_engine_command(engine_command)
    if (kv_problem := kv_transfer_problem(engine_command)) is not None:
        bad_input(f"the engine command's {kv_problem}")
    bundles = _read_bundles(bundle_files, bundle_name)
    if not preload_argv and (daemon_bundle := next((b for b in bundles if b.preload_command), None)):
        bad_input(
            f"--bundle {daemon_bundle.name}: its preload_command needs a host that runs a daemon: pass "
            "--preload-command (the daemon of the bundle the engine starts with) and --preload-health"
        )
    strategy = _startup_failure_strategy(on_startup_failure, bundles, bundle_name)
    explain = precheck_flags.pop("explain")
    precheck = precheck_settings(precheck_flags)
    if explain:
        sys.exit(run_on_uvloop(explain_precheck(engine_command, precheck, preload_argv, click.echo)))
    token = read_token(token_file)
    if token is None and not is_loopback(host):
        bad_input(
            f"refusing to serve the management API on {host} without a token: "
            "pass --token-file or set CORRAL_TOKEN (or bind --host 127.0.0.1)"
        )
    state_dir = state_dir or _default_state_dir(port)
    if (problem := state_dir_problem(state_dir)) is not None:
        bad_input(
            f"state dir {state_dir} cannot be used: {problem}; pass --state-dir DIR, writable by this user"
        )
    config = SupervisorConfig(
        engine_argv=engine_command,
        engine_url=engine_url.rstrip("/"),
        host=host,
        port=port,
        model=model,
        gates=gates,
        dependency_timeout=dependency_timeout,
        startup_timeout=startup_timeout,
        startup_restarts=startup_restarts,
        failure_restarts=failure_restarts,
        restart_backoff=restart_backoff,
        stall_seconds=stall_seconds,
        unanswered_seconds=unanswered_seconds,
        idle_sleep=IdleSleepSettings(
            sleep_after_seconds, sleep_level, sleep_mode, sleep_peers, sleep_last_awake
        ),
        memory=MemoryThresholds.from_flags(sleep_residue_gib, wake_tolerance),
        drain=DrainSettings(
            policy=DrainPolicy(drain_policy),
            propagation_timeout=propagation_timeout,
            quiet_period=quiet_period,
            drain_timeout=drain_timeout,
            shutdown_timeout=shutdown_timeout,
            transfer_wait=drain_transfer_wait,
        ),
        state_dir=state_dir,
        oplog_max_bytes=oplog_max_bytes,
        oplog_keep=oplog_keep,
        token=token,
        lora=adapters,
        bundles=bundles,
        bundle_name=bundle_name,
        on_startup_failure=strategy,
        role=role,
        kernel_log=kernel_log,
        precheck=precheck,
        preload_argv=preload_argv,
        preload_health=preload_health,
        preload_restarts=preload_restarts,
        gate_port=gate_port,
        gate_host=gate_host,
    )
    config = replace(config, tracing=settings_from_flag(otlp_traces_endpoint, "corral-supervisor"))
    sys.exit(run_on_uvloop(serve(config)))


def _read_bundles(files: tuple[Path, ...], running: str) -> tuple[BundleSpec, ...]:
    """The bundles declared with --bundle; exits 2 naming a bad file or a name used twice."""
    bundles: dict[str, BundleSpec] = {}
    for path in files:
        try:
            bundle = load_bundle(path)
        except BundleError as exc:
            bad_input(str(exc))
        if bundle.name in bundles or bundle.name == running:
            bad_input(f"--bundle {path}: the name {bundle.name!r} is declared twice (or is --bundle-name)")
        bundles[bundle.name] = bundle
    return tuple(bundles.values())


def _startup_failure_strategy(text: str, bundles: tuple[BundleSpec, ...], running: str) -> OnStartupFailure:
    """--on-startup-failure, its rollback bundle declared; exits 2 with the fix otherwise."""
    try:
        choice = parse_on_startup_failure(text)
        check_rollback_bundle(choice, [b.name for b in bundles], running)
    except StrategyError as exc:
        bad_input(str(exc))
    return choice
