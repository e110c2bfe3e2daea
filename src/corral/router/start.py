"""What `corral router` runs (corral.router.cli holds its flags): parse the flags into the router's
configuration, run the router app on uvloop (in one process, or in each of `--workers N`), stop
cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from aiohttp import web

from corral import aio
from corral.k8s.watch.client import KubeApiError
from corral.router.app import (
    CONNECTION_GUARD,
    HOT_PATH,
    MEMBERSHIP,
    RouterConfig,
    build_app,
)
from corral.router.core_config import core_config_of
from corral.router.datapath.retry_budget import RetryBudgetConfig
from corral.router.edge.access_options import EdgeAccess
from corral.router.edge.client_limit_flags import ClientLimits
from corral.router.edge.parse_errors import ParseErrorLog
from corral.router.edge.peer_access import peer_settings
from corral.router.flow.config import FlowConfig
from corral.router.flow.host_flows import HostFlowTables
from corral.router.membership.membership import Membership
from corral.router.routing.worker_journal import WorkerJournals
from corral.router.serving.server import LeanServer
from corral.router.workers import WorkerPool, WorkerSlot, cpu_limit, reserve_port
from corral.tracing.flag import settings_from_flag

log = logging.getLogger("corral.router")

WORKER_WARMUP_SECONDS = 5.0  # a worker sharing the port listens once something is routable, or after this


def start_router(
    host: str,
    port: int,
    workers: int | None,
    peers: tuple[str, ...],
    peer_token_file: Path | None,
    wake_hold_seconds: float,
    wake_mode: str,
    wake_hold_max: int,
    retry_budget_ratio: float,
    retry_budget_min: int,
    max_retries: int,
    eject_seconds: float,
    request_timeout: float,
    http_server: str,
    shutdown_timeout: float,
    log_level: str,
    otlp_traces_endpoint: str | None,
    client_limits: ClientLimits,
    access: EdgeAccess,
    flow: FlowConfig | None,
    **core_flags: Any,
) -> None:
    """The router, as the flags describe it: checked, configured and run until stopped."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    core = core_config_of(core_flags)  # the flags every front door shares (corral.router.core_options)
    # one life of this router, shared by its workers: a peer that sees another starts reading it anew
    peer = peer_settings(peers, peer_token_file, secrets.token_hex(8))
    config = replace(
        core,
        peers=peer,
        wake_hold_seconds=wake_hold_seconds,
        wake_mode=wake_mode,
        wake_hold_max=wake_hold_max,
        retry_budget=RetryBudgetConfig(ratio=retry_budget_ratio, min_retries=retry_budget_min),
        max_retries=max_retries,
        eject_seconds=eject_seconds,
        request_timeout=request_timeout or None,
        client_limits=client_limits,
        api_keys_file=access.api_keys_file,
        admin=access.admin,
        engine_api_key=access.engine_api_key,
        http_server=http_server,
    )
    access.log_at_start()
    config = replace(config, tracing=settings_from_flag(otlp_traces_endpoint, "corral-router"))
    config = replace(config, flow=flow)  # --flow-control (corral.router.flow)
    if peer is not None:
        log.info("sharing picks with %d peer routers: %s", len(peer.urls), ", ".join(peer.urls))
    count = workers or cpu_limit()
    if count == 1:
        aio.run(serve(config, host, port, shutdown_timeout))
        return
    sys.exit(serve_workers(config, host, port, shutdown_timeout, count))


def serve_workers(config: RouterConfig, host: str, port: int, shutdown_timeout: float, count: int) -> int:
    """`--workers N`: the port held here (checked free, one port for all with --port 0), N forked workers
    each serving it as replica ROUTER_ID/wK; returns the exit code (corral.router.workers.WorkerPool)."""
    try:
        held, port = reserve_port(host, port)
    except OSError as exc:
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
            "choose a free --port or stop what holds it"
        ) from None
    base_id = config.streams.router_id

    def worker_main(slot: WorkerSlot, ready: Callable[[], None]) -> int:
        held.close()
        for handler in logging.getLogger().handlers:  # each line says which worker wrote it
            handler.setFormatter(
                logging.Formatter(f"%(asctime)s %(levelname)s {slot.name} %(name)s: %(message)s")
            )
        streams = replace(config.streams, router_id=slot.router_id(base_id))
        worker = replace(slot, flow_tables=flow_tables)
        aio.run(serve(replace(config, streams=streams, worker=worker), host, port, shutdown_timeout, ready))
        return 0

    with held, tempfile.TemporaryDirectory(prefix="corral-router-") as run_dir:
        log.info(
            "corral router: %d workers on http://%s:%d, router ids %s/w1..w%d",
            count,
            host,
            port,
            base_id,
            count,
        )
        journals = WorkerJournals(count)  # shared by the forked workers: they route as one
        flow_tables = HostFlowTables(journals) if config.flow is not None else None  # and share slots as one
        return WorkerPool(count, worker_main, Path(run_dir), shutdown_timeout, journals).run()


async def serve(
    config: RouterConfig,
    host: str,
    port: int,
    shutdown_timeout: float,
    ready: Callable[[], None] | None = None,
) -> None:
    """Run the router until SIGTERM/SIGINT; `ready` is called once it listens (a worker tells the parent)."""
    app = build_app(config)
    parse_log = ParseErrorLog()
    logging.getLogger("aiohttp.server").addFilter(parse_log)  # one line per malformed request
    lean: LeanServer | None = None
    runner = web.AppRunner(
        app,
        access_log=None,
        handler_cancellation=True,  # a client that hangs up cancels its upstream request
        shutdown_timeout=shutdown_timeout,
    )
    try:
        await runner.setup()
    except KubeApiError as exc:
        log.error("cannot start Kubernetes membership: %s", exc)
        raise SystemExit(2) from None
    guard = app[CONNECTION_GUARD]
    admin_listener: asyncio.Server | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        # not a TCPSite: the guard listens so that each connection is held to config.client_limits
        assert runner.server is not None
        shared = config.worker is not None  # --workers N (N >= 2): every worker binds the same ports
        if shared:
            # A sibling that answers /health (200 once it has something routable) vouches for every
            # worker behind the port, so none listens with an empty table: at a restart, and at the first
            # start, where one worker's first probe round can end before another's.
            await _routable(app[MEMBERSHIP], WORKER_WARMUP_SECONDS)
        if config.http_server == "lean":
            limits = config.client_limits
            lean = LeanServer(
                app[HOT_PATH], guard if limits.watches_connections else None, runner.server, parse_log
            )
            await guard.listen(
                lean.protocol, host, port, backlog=1024, reuse_port=shared, watched_inside=True
            )
        else:
            await guard.listen(runner.server, host, port, backlog=1024, reuse_port=shared)
        admin = config.admin
        if admin.admin_port is not None:  # /metrics and /v1/fleet only (corral.router.edge.admin_access)
            admin_listener = await loop.create_server(
                runner.server, admin.admin_host, admin.admin_port, reuse_address=True, reuse_port=shared
            )
        if config.kubernetes is not None:
            members = f"pods in {config.kubernetes.namespace} matching {config.kubernetes.selector}"
        elif config.backends_file is not None:
            members = f"backends from {config.backends_file}"
        else:
            members = f"{len(config.backends)} backends"
            if config.supervisors:
                members += f", {len(config.supervisors)} supervised"
        log.info(
            "corral router ready on http://%s:%d (router id %s, policy %s, %s)",
            host,
            port,
            config.streams.router_id,
            config.policy,
            members,
        )
        if ready is not None:
            ready()
        aio.settle_heap()  # the hot path's CPU: no full collections over what startup built
        await stop.wait()
        log.info("corral router stopping")
    finally:
        guard.stop_accepting()
        if admin_listener is not None:
            admin_listener.close()
        if lean is not None:
            await lean.shutdown(shutdown_timeout)
        await runner.cleanup()
        await guard.close()


async def _routable(membership: Membership, within: float) -> None:
    """Return once membership has a routable endpoint, or after `within` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    # membership has no event for "something became routable"; once per restart, for at most `within`
    while membership.ready_count() == 0 and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
