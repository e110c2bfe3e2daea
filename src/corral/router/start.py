"""What `corral router` runs (corral.router.cli holds its flags): parse the flags into the router's
configuration, run the router app on uvloop (in one process, or in each of `--workers N`), stop
cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import click
from aiohttp import web

from corral import aio
from corral.k8s.watch.client import KubeApiError
from corral.router.app import (
    CONNECTION_GUARD,
    HOT_PATH,
    MEMBERSHIP,
    KubernetesDiscovery,
    RouterConfig,
    build_app,
)
from corral.router.datapath.retry_budget import RetryBudgetConfig
from corral.router.discovery.adapter_carry import CarrySettings
from corral.router.discovery.backends_file import BackendsFileError, read_backends
from corral.router.discovery.supervisor_stream import (
    StreamSettings,
    TokenFor,
    default_router_id,
    per_pod_tokens,
)
from corral.router.edge.access_options import EdgeAccess
from corral.router.edge.client_limit_flags import ClientLimits
from corral.router.edge.parse_errors import ParseErrorLog
from corral.router.edge.peer_access import peer_settings
from corral.router.flow.config import FlowConfig
from corral.router.membership.membership import Membership
from corral.router.routing.config import PolicyConfigError, RoutingConfig, load_routing_config
from corral.router.routing.prompt_tokens import prompt_tokens
from corral.router.routing.worker_journal import WorkerJournals
from corral.router.serving.server import LeanServer
from corral.router.workers import WorkerPool, WorkerSlot, cpu_limit, reserve_port
from corral.supervisor_tokens import FleetKeyError, TokenFileError, read_fleet_key, read_management_token
from corral.tracing.flag import settings_from_flag

log = logging.getLogger("corral.router")

_SUPERVISED = re.compile(r"^(https?://[^=\s]+)=(https?://\S+)$")
_ENGINE_URL = re.compile(r"^https?://[^=\s]+$")
WORKER_WARMUP_SECONDS = 5.0  # a worker sharing the port listens once something is routable, or after this


def parse_supervised(specs: tuple[str, ...]) -> dict[str, str]:
    """`ENGINE_URL=SUPERVISOR_URL` pairs; a usage error names the one that is not."""
    pairs: dict[str, str] = {}
    for spec in specs:
        match = _SUPERVISED.match(spec.strip())
        if match is None:
            raise click.UsageError(
                f"--supervised {spec!r}: write ENGINE_URL=SUPERVISOR_URL, "
                "e.g. http://127.0.0.1:9001=http://127.0.0.1:9101"
            )
        pairs[match.group(1).rstrip("/")] = match.group(2).rstrip("/")
    return pairs


def parse_roles(prefill: tuple[str, ...], decode: tuple[str, ...]) -> dict[str, str]:
    """Engine url -> role from --prefill and --decode; a usage error names a URL given both roles or
    one that is not an http(s) URL."""
    roles: dict[str, str] = {}
    for flag, role, urls in (("--prefill", "prefill", prefill), ("--decode", "decode", decode)):
        for spec in urls:
            url = spec.strip().rstrip("/")
            if not _ENGINE_URL.match(url):
                raise click.UsageError(
                    f"{flag} {spec!r}: give the engine's base URL, e.g. http://127.0.0.1:9001"
                )
            if roles.get(url, role) != role:
                raise click.UsageError(
                    f"{url} is given as --prefill and --decode; an engine has one role (run it with "
                    'kv_role "kv_both" and list it once with --backend to let it do both)'
                )
            roles[url] = role
    return roles


def read_supervisor_token(path: Path | None) -> str | None:
    """The supervisors' management token: from the file, else $CORRAL_TOKEN, else none."""
    try:
        return read_management_token(path)
    except TokenFileError as exc:
        raise click.UsageError(exc.naming("--supervisor-token-file")) from None


def start_router(
    host: str,
    port: int,
    workers: int | None,
    backends: tuple[str, ...],
    prefill: tuple[str, ...],
    decode: tuple[str, ...],
    supervised: tuple[str, ...],
    supervisor_port: int | None,
    supervisor_token_file: Path | None,
    supervisor_token_key_file: Path | None,
    router_id: str | None,
    peers: tuple[str, ...],
    peer_token_file: Path | None,
    supervisor_heartbeat: float,
    wake_hold_seconds: float,
    wake_mode: str,
    wake_hold_max: int,
    carry_adapters_seconds: float,
    backends_file: Path | None,
    discovery: str | None,
    namespace: str | None,
    selector: str | None,
    kubeconfig: str | None,
    engine_port: int,
    k8s_resync_seconds: float,
    k8s_watch_timeout: int,
    probe_timeout: float,
    retry_budget_ratio: float,
    retry_budget_min: int,
    policy: str,
    session_header: str,
    policy_config: Path | None,
    tokenizer: str | None,
    slow_start_seconds: float,
    max_retries: int,
    eject_seconds: float,
    models_refresh_seconds: float,
    request_timeout: float,
    http_server: str,
    shutdown_timeout: float,
    log_level: str,
    otlp_traces_endpoint: str | None,
    client_limits: ClientLimits,
    access: EdgeAccess,
    flow: FlowConfig | None,
) -> None:
    """The router, as the flags describe it: checked, configured and run until stopped."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if discovery is None:
        discovery = "file" if backends_file is not None else "static"
    supervisors = parse_supervised(supervised)
    roles = parse_roles(prefill, decode)
    backends = tuple(dict.fromkeys([*(b.rstrip("/") for b in backends), *supervisors, *roles]))
    token = read_supervisor_token(supervisor_token_file)
    tokens = _per_pod_tokens(supervisor_token_key_file, supervisor_token_file, discovery)
    kubernetes: KubernetesDiscovery | None = None
    if supervisor_port is not None and discovery != "k8s":
        raise click.UsageError("--supervisor-port is for --discovery k8s; use --supervised otherwise.")
    if discovery == "k8s":
        if backends or backends_file:
            raise click.UsageError(
                "--discovery k8s takes no --backend, --prefill, --decode, --supervised or --backends-file "
                "(label the pods corral.dev/role=prefill|decode instead)."
            )
        if not namespace or not selector:
            raise click.UsageError(
                "--discovery k8s needs --namespace NS and --selector LABELS (e.g. app=vllm)."
            )
        kubernetes = KubernetesDiscovery(
            namespace=namespace,
            selector=selector,
            kubeconfig=kubeconfig,
            engine_port=engine_port,
            resync_seconds=k8s_resync_seconds,
            watch_timeout_seconds=k8s_watch_timeout,
            supervisor_port=supervisor_port,
        )
    elif discovery == "file":
        if backends_file is None or backends:
            raise click.UsageError(
                "--discovery file needs --backends-file PATH and no --backend, --prefill or --decode "
                "(write role=prefill|decode on the file's lines instead)."
            )
        try:
            read_backends(backends_file)
        except BackendsFileError as exc:
            raise click.UsageError(str(exc)) from None
    elif not backends:
        raise click.UsageError(
            "Name the engines: --backend URL, --prefill URL and --decode URL, or "
            "--supervised ENGINE_URL=SUPERVISOR_URL (repeatable), "
            "--backends-file PATH, or --discovery k8s --namespace NS --selector LABELS."
        )
    elif backends_file is not None:
        raise click.UsageError("Use either --backend/--supervised or --backends-file, not both.")
    # one life of this router, shared by its workers: a peer that sees another starts reading it anew
    peer = peer_settings(peers, peer_token_file, secrets.token_hex(8))
    config = RouterConfig(
        peers=peer,
        backends=backends,
        supervisors=supervisors,
        roles=roles,
        streams=StreamSettings(
            router_id=router_id or default_router_id(),
            token=token,
            tokens=tokens,
            heartbeat_seconds=supervisor_heartbeat,
        ),
        wake_hold_seconds=wake_hold_seconds,
        wake_mode=wake_mode,
        wake_hold_max=wake_hold_max,
        carry_adapters=CarrySettings(hold_seconds=carry_adapters_seconds) if carry_adapters_seconds else None,
        backends_file=backends_file,
        kubernetes=kubernetes,
        probe_timeout=probe_timeout,
        retry_budget=RetryBudgetConfig(ratio=retry_budget_ratio, min_retries=retry_budget_min),
        policy=policy,
        session_header=session_header.lower(),
        routing=_routing_config(policy_config),
        slow_start_seconds=slow_start_seconds,
        tokenizer=_tokenizer(tokenizer),
        max_retries=max_retries,
        eject_seconds=eject_seconds,
        models_refresh_seconds=models_refresh_seconds,
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


def _tokenizer(source: str | None) -> str | None:
    """`--tokenizer`, checked here so that a bad one stops the start with its reason."""
    try:
        prompt_tokens(source)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tokenizer") from None
    return source


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
        aio.run(serve(replace(config, streams=streams, worker=slot), host, port, shutdown_timeout, ready))
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
        return WorkerPool(count, worker_main, Path(run_dir), shutdown_timeout, journals).run()


def _per_pod_tokens(key_file: Path | None, token_file: Path | None, discovery: str) -> TokenFor | None:
    """--supervisor-token-key-file: each pod's token from the fleet key; a usage error names a bad key."""
    if key_file is None:
        return None
    if discovery != "k8s":
        raise click.UsageError(
            "--supervisor-token-key-file derives each pod's token from its name: it needs --discovery k8s; "
            "use --supervisor-token-file otherwise."
        )
    if token_file is not None:
        raise click.UsageError(
            "Use either --supervisor-token-key-file (a token per pod) or --supervisor-token-file, not both."
        )
    try:
        return per_pod_tokens(read_fleet_key(key_file))
    except FleetKeyError as exc:
        raise click.UsageError(f"--supervisor-token-key-file: {exc}") from None


def _routing_config(path: Path | None) -> RoutingConfig:
    if path is None:
        return RoutingConfig()
    try:
        return load_routing_config(path)
    except PolicyConfigError as exc:
        raise click.UsageError(str(exc)) from None


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
