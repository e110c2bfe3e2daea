"""Running one supervisor process: the engine supervisor, its probes and management API, the preload
daemon and the admission gate, started in that order, stopped in reverse, with SIGTERM/SIGINT turned
into a drain. The composition root of `corral supervise run`; the CLI parses, this serves.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from typing import Any

import click
from aiohttp import web

from corral.supervisor.lifecycle.config import SupervisorConfig
from corral.supervisor.state.oplog import StateDirLocked


def printer(prefix: str) -> Any:
    def emit(line: str) -> None:
        sys.stdout.write(f"{prefix} {line}\n")
        sys.stdout.flush()

    return emit


def supervisor_log(message: str) -> None:
    sys.stdout.write(f"[supervisor] {time.strftime('%H:%M:%S')} {message}\n")
    sys.stdout.flush()


async def serve(config: SupervisorConfig) -> int:
    # imported here so that the CLI answers bad input without loading the server's modules
    from corral.supervisor.http.api import SupervisorAPI
    from corral.supervisor.lifecycle.supervisor import EngineSupervisor
    from corral.supervisor.runbook.switch_bundle import roll_back
    from corral.tracing.provider import start_tracing
    from corral.tracing.records import RecordTraces

    supervisor = EngineSupervisor(config, supervisor_log, printer("[engine]"))
    supervisor.start_rollback = lambda failure: roll_back(supervisor, failure)
    if config.tracing is not None:  # flushed at exit by the provider's own atexit hook
        supervisor.record_traces = RecordTraces(start_tracing(config.tracing).tracer("corral.supervisor"))
    try:
        await supervisor.open()
    except StateDirLocked as exc:
        click.echo(f"corral supervise: {exc}", err=True)
        return 2
    except OSError as exc:  # e.g. an oplog.jsonl that cannot be read
        click.echo(
            f"corral supervise: state dir {config.state_dir} cannot be used: {exc.strerror or exc}"
            + (f" ({exc.filename})" if exc.filename else ""),
            err=True,
        )
        return 2
    api = SupervisorAPI(supervisor, config.token)
    runner = web.AppRunner(api.app(), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, config.host, config.port).start()
    except OSError as exc:
        click.echo(
            f"corral supervise: cannot listen on {config.host}:{config.port}: {exc.strerror}", err=True
        )
        await runner.cleanup()
        await supervisor.close()
        return 2
    supervisor_log(
        f"probes and management on http://{config.host}:{config.port} "
        f"(management {'token required' if config.token else 'loopback, no token'}); "
        f"engine at {config.engine_url}; state dir {config.state_dir}"
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, supervisor.on_signal, sig)
    if config.preload_argv:
        from corral.supervisor.lifecycle.preload import PreloadDaemon

        assert config.preload_health is not None
        await supervisor.start_preload(
            PreloadDaemon(config.preload_argv, config.preload_health, printer("[preload]"))
        )
    gate_runner = await start_gate(supervisor, config)
    if gate_runner is None and config.gate_port is not None:
        await runner.cleanup()
        await supervisor.close()
        return 2
    supervisor.start()
    idle_task: asyncio.Task[None] | None = None
    if config.idle_sleep.after_seconds > 0:
        from corral.supervisor.runbook.idle_sleep import IdleSleep

        supervisor.idle_sleep = IdleSleep(supervisor, config.idle_sleep)
        idle_task = asyncio.create_task(supervisor.idle_sleep.run(), name="idle-sleep")
    try:
        await supervisor.exit_requested.wait()
    finally:
        if idle_task is not None:
            idle_task.cancel()
        if gate_runner is not None:
            await gate_runner.cleanup()
        await runner.cleanup()
        await supervisor.close()
    return 1 if supervisor.unrecoverable else 0


async def start_gate(supervisor: Any, config: SupervisorConfig) -> web.AppRunner | None:
    from corral.supervisor.http.admission import AdmissionGate
    from corral.supervisor.http.admission_metrics import AdmissionCollector
    from corral.supervisor.http.inflight import ForcedExit
    from corral.supervisor.lifecycle.states import DrainPhase

    if config.gate_port is None:
        return None

    def forced_exit(ended: ForcedExit) -> None:
        record = ended.to_json()
        supervisor.oplog.append("forced_exit", state=supervisor.machine.state.value, **record)
        emitted = "after tokens were sent" if ended.request.tokens_emitted else "before any token"
        supervisor_log(f"forced exit: request {ended.request.request_id} ({ended.how}) {emitted}")

    gate = AdmissionGate(
        config.engine_url,
        lambda: supervisor.machine.state,
        on_forced_exit=forced_exit,
        leaving_routing=lambda: supervisor.machine.sub_state == DrainPhase.LEAVING_ROUTING,
    )
    supervisor.gate = gate
    supervisor.metrics.registry.register(AdmissionCollector(gate))
    runner = web.AppRunner(gate.app(), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, config.gate_host, config.gate_port).start()
    except OSError as exc:
        click.echo(
            f"corral supervise: cannot listen on {config.gate_host}:{config.gate_port}: {exc.strerror}",
            err=True,
        )
        await runner.cleanup()
        return None
    supervisor_log(f"admission gate (data path) on http://{config.gate_host}:{config.gate_port}")
    return runner
