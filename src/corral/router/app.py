"""The router's aiohttp application: its own endpoints (/health, /metrics, /v1/models, /v1/fleet)
and the OpenAI paths handed to the proxy, with the shared upstream session, the membership source
(static list, backends file or Kubernetes) and the supervisor state streams started and stopped with
the app."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from corral.openai_errors import error_response
from corral.router.core import (
    KubernetesDiscovery,
    PodApiFactory,
    RouterCore,
    connect_pod_api,
    source_name,
)
from corral.router.dashboard.feed import DashboardFeed
from corral.router.dashboard.page import DASHBOARD_PATH, page_handler, to_dashboard, wants_page
from corral.router.dashboard.sampler import HistoryLoop
from corral.router.datapath.aiohttp_exchange import AiohttpReply, AiohttpRequest
from corral.router.datapath.proxy import Proxy, ProxyConfig
from corral.router.datapath.retry_budget import RetryBudgetConfig
from corral.router.datapath.upstream import UpstreamClient
from corral.router.datapath.wake_on_demand import DEFAULT_MAX_HELD, HOLD, WakeOnDemand, WakeSettings
from corral.router.discovery.adapter_carry import CarrySettings
from corral.router.discovery.supervisor_stream import StreamSettings, default_router_id
from corral.router.edge.admin_access import ADMIN_PATHS, OPEN_PATHS, AdminAccess, AdminAccessConfig
from corral.router.edge.client_connections import ConnectionGuard
from corral.router.edge.client_limit_flags import ClientLimits
from corral.router.edge.client_limits import ClientLimitsCollector, ClientLimitStats, client_limits_middleware
from corral.router.edge.expect_continue import expect_handler
from corral.router.edge.peer_access import PeerAccess, PeerSettings
from corral.router.edge.refused_framing import refuse_framing
from corral.router.edge.tenants import TenantCollector, TenantGate, Tenants, tenant_of
from corral.router.flow.config import FlowConfig
from corral.router.flow.control import FlowControl
from corral.router.flow.host_flows import HostFlows
from corral.router.membership.membership import Membership
from corral.router.membership.pairs import model_pairs
from corral.router.routing.config import RoutingConfig
from corral.router.routing.peer_follower import PeerFollower, PeerFollowers
from corral.router.routing.peer_wire import PEER_PICKS_PATH, PeerWireError, encode_page, parse_cursor
from corral.router.routing.pick_log import PickLog
from corral.router.routing.worker_journal import WorkerJournals, WorkerSync, route_as_one
from corral.router.serving.server import HotPath
from corral.router.telemetry.endpoint_series import endpoint_series
from corral.router.telemetry.metrics import RouterCollector, RouterMetrics
from corral.router.telemetry.request_trace import RequestTracer
from corral.router.telemetry.scaling import ScalingCollector, ScalingTargets
from corral.router.telemetry.worker_pages import WorkerPages
from corral.router.workers import WorkerSlot
from corral.tracing.provider import start_tracing
from corral.tracing.settings import TracingSettings

# POST paths served by vLLM outside /v1 that are per-request inference, hence routable.
ROOT_INFERENCE_PATHS = (
    "/tokenize",
    "/detokenize",
    "/pooling",
    "/classify",
    "/score",
    "/rerank",
    "/invocations",
)
# The busiest OpenAI paths, routed by exact match ahead of the `/v1/...` pattern that serves them too.
HOT_INFERENCE_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
# Per-engine management calls: sending them to one engine picked at random would be wrong.
ENGINE_ONLY_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class RouterConfig:
    backends: Sequence[str] = ()
    # engine url -> its supervisor's url (`--supervised ENGINE=SUPERVISOR`); these are in `backends` too
    supervisors: Mapping[str, str] = field(default_factory=dict)
    # engine url -> its declared role (`--prefill`, `--decode`); these are in `backends` too
    roles: Mapping[str, str] = field(default_factory=dict)
    backends_file: Path | None = None
    kubernetes: KubernetesDiscovery | None = None
    retry_budget: RetryBudgetConfig = field(default_factory=RetryBudgetConfig)
    policy: str = "round_robin"
    session_header: str = "x-session-id"
    routing: RoutingConfig = field(default_factory=RoutingConfig)  # --policy-config
    slow_start_seconds: float = 0.0  # --slow-start-seconds; the policy config's slow_start_* win
    max_retries: int = 2
    eject_seconds: float = 5.0
    models_refresh_seconds: float = 5.0
    request_timeout: float | None = 300.0
    connect_timeout: float = 5.0
    probe_timeout: float = 2.0
    streams: StreamSettings = field(default_factory=lambda: StreamSettings(router_id=default_router_id()))
    wake_hold_seconds: float = 0.0  # > 0: scale from zero (datapath/wake_on_demand.py)
    wake_mode: str = HOLD  # --wake-mode: hold the requests, or answer 503 + Retry-After at once
    wake_hold_max: int = DEFAULT_MAX_HELD  # --wake-hold-max: requests held per model
    scaling_targets: ScalingTargets = field(default_factory=ScalingTargets)  # desired replicas' rule
    # --carry-adapters-seconds: a joining engine held until the fleet's LoRA adapters are loaded there
    carry_adapters: CarrySettings | None = None
    client_limits: ClientLimits = field(default_factory=ClientLimits)  # --header-timeout, --max-in-flight...
    api_keys_file: Path | None = None  # --api-keys-file: tenants; None leaves the router open
    flow: FlowConfig | None = None  # --flow-control: hold requests while the engines are saturated
    admin: AdminAccessConfig = field(default_factory=AdminAccessConfig)  # who reads /metrics, /v1/fleet
    engine_api_key: str | None = field(default=None, repr=False)  # --engine-api-key-file
    worker: WorkerSlot | None = None  # one of `--workers N` (N > 1): its name, its siblings' sockets
    # --tokenizer: sim | a model's tokenizer; with one, prefix routing reads the engines' KV events
    tokenizer: str | None = None
    http_server: str = "lean"  # --http-server: lean | aiohttp (corral.router.serving)
    peers: PeerSettings | None = None  # --peer, --peer-token-file: replicas that share their picks
    tracing: TracingSettings | None = None  # --otlp-traces-endpoint, OTEL_*: a span per request

    def engine_headers(self) -> dict[str, str]:
        """What every request to an engine carries: its API key, when it wants one."""
        return {"Authorization": f"Bearer {self.engine_api_key}"} if self.engine_api_key else {}


MEMBERSHIP = web.AppKey("membership", Membership)
METRICS = web.AppKey("metrics", RouterMetrics)
# Listens for the router (cli.serve): each client connection held to config.client_limits.
CONNECTION_GUARD = web.AppKey("connection_guard", ConnectionGuard)
# What the lean server (--http-server lean) answers itself, and with what (corral.router.serving)
HOT_PATH = web.AppKey("hot_path", HotPath)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Not a tenant's: the probe, and the admin routes (corral.router.edge.admin_access decides who reads those).
ADMIN_AND_OPEN_PATHS = ADMIN_PATHS | OPEN_PATHS
# The router's own endpoints: cheap, engine-free, and what an operator needs during overload.
OWN_ENDPOINTS = ("/health", "/livez", "/metrics", "/v1/models", "/v1/fleet")


def build_app(config: RouterConfig, pod_api: PodApiFactory = connect_pod_api) -> web.Application:
    limits, limit_stats = config.client_limits, ClientLimitStats()
    guard = ConnectionGuard(limits, limit_stats)
    limit_middleware = client_limits_middleware(limits, limit_stats, guard, OWN_ENDPOINTS)
    admin = AdminAccess(config.admin)
    # a bad file raises TenantsFileError here; `corral router` checks it first and exits 2
    tenants = Tenants.from_file(config.api_keys_file) if config.api_keys_file is not None else None
    gate = TenantGate(tenants) if tenants is not None else None
    expect = expect_handler(limits, limit_stats, gate)  # 401 / 413 before `100 Continue`, not after the body

    peer_access = PeerAccess(config.peers, admin) if config.peers is not None else None

    @web.middleware
    async def edge(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Admin routes to those AdminAccess trusts, the peer route to the peers (PeerAccess);
        everything else but /health to a tenant."""
        if peer_access is not None and request.path == PEER_PICKS_PATH:
            refused = peer_access.refuse(request)
            return refused if refused is not None else await handler(request)
        refused = admin.refuse(request)
        if refused is not None:
            return refused
        if gate is None or request.path in ADMIN_AND_OPEN_PATHS:
            return await handler(request)
        return await gate.serve(request, handler)

    app = web.Application(
        client_max_size=limits.max_body_bytes,  # 0: no limit; over it, request.read() raises 413
        middlewares=[refuse_framing, limit_middleware, edge]
        if limits.watches_requests
        else [refuse_framing, edge],
    )
    app[CONNECTION_GUARD] = guard
    core = RouterCore(config)
    membership, metrics, prefix_memory = core.membership, core.metrics, core.prefix_memory
    kv_feeds, carry, routing = core.kv_feeds, core.carry, core.routing
    app[MEMBERSHIP] = membership
    app[METRICS] = metrics
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClientLimitsCollector(limits, limit_stats))
    if gate is not None:
        registry.register(TenantCollector(gate))
    holder: dict[str, Proxy] = {}
    flow = (
        FlowControl(
            config.flow,
            membership,
            routing.board,
            routing.scraper is not None,
            config.routing,
            metrics.engine_input,
            HostFlows(config.worker.flow_tables, config.worker.index, config.flow.share_window_seconds)
            if config.worker is not None and config.worker.flow_tables is not None
            else None,
        )
        if config.flow is not None
        else None
    )
    if flow is not None:
        registry.register(flow.collector)
    sync: WorkerSync | None = None
    journals = config.worker.journals if config.worker is not None else None
    if journals is None and config.peers is not None:  # one process: its own journal is the peers' log
        journals = WorkerJournals(1)
    if journals is not None:  # the host's workers route as one
        index = config.worker.index if config.worker is not None else 1
        sync = route_as_one(journals, index, membership, routing, prefix_memory)
        placement_lock = journals.placement_lock
        if placement_lock is not None:
            metrics.placement_waited_out = lambda: placement_lock.waited_out
    peers = config.peers
    following: list[PeerFollower] = []
    pick_log: PickLog | None = None
    if peers is not None and sync is not None:
        pick_log = PickLog(sync, peers.incarnation)
        if sync.index == 1:  # one worker per host follows the peers and relays their picks to its siblings
            relay = sync.journals.count > 1
            policies = routing.selector.policies
            following = [
                PeerFollower(
                    url, peers.token, membership.get, prefix_memory, policies, sync, relay, peers.incarnation
                )
                for url in peers.urls
            ]
    followers = PeerFollowers(following)
    slow_start = routing.slow_start
    registry.register(
        RouterCollector(metrics, membership.endpoints, slow_start.weights if slow_start.enabled else None)
    )
    wake = (
        WakeOnDemand(
            membership,
            config.streams.token_for,
            WakeSettings(config.wake_hold_seconds, config.wake_mode, config.wake_hold_max),
            metrics,
        )
        if config.wake_hold_seconds > 0
        else None
    )
    registry.register(
        ScalingCollector(
            membership.endpoints,
            lambda model: len(membership.eligible(model)),
            routing.board,
            wake.held_now if wake is not None else dict,
            wake.oldest_held_seconds if wake is not None else dict,
            config.scaling_targets,
        )
    )

    def own_page() -> bytes:
        return generate_latest(registry) + endpoint_series(membership.endpoints())

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        # the read timeout bounds every silence of the backend: before the first byte (then the
        # proxy ejects and retries) and between chunks (then the stream ends with an error).
        session = UpstreamClient(connect_timeout=config.connect_timeout, read_timeout=config.request_timeout)
        holder["proxy"] = Proxy(
            membership,
            routing.policy,
            session,
            metrics,
            ProxyConfig(
                max_retries=config.max_retries,
                eject_seconds=config.eject_seconds,
                retry_budget=config.retry_budget,
            ),
            decode_policy=routing.selector.policies["load"],  # P/D decode legs: load-aware
        )
        if wake is not None:
            holder["proxy"].wake_on_demand = wake
        holder["proxy"].drop_client_authorization = tenants is not None
        if flow is not None:
            holder["proxy"].flow = flow.gate
        if config.engine_api_key:
            holder["proxy"].engine_authorization = f"Bearer {config.engine_api_key}"
        try:
            await core.start_streams(pod_api)
        except BaseException:
            session.close()
            raise
        if pages is not None:
            await pages.start()
        await core.start_routing()
        if tenants is not None:
            await tenants.start()
        await followers.start()
        await dashboard_history.start()
        if flow is not None:
            await flow.start()
        try:
            yield
        finally:
            if flow is not None:
                await flow.stop()
            await followers.stop()
            if tenants is not None:
                await tenants.stop()
            await dashboard_feed.stop()
            await dashboard_history.stop()
            if pages is not None:
                await pages.stop()
            await core.stop()
            session.close()

    app.cleanup_ctx.append(lifecycle)

    async def traces(app: web.Application) -> AsyncIterator[None]:
        """Each process (each of `--workers N`) exports its own spans, through its own exporter thread."""
        assert config.tracing is not None
        tracing = start_tracing(config.tracing)
        holder["proxy"].tracer = RequestTracer(tracing.tracer("corral.router"))
        try:
            yield
        finally:
            await asyncio.to_thread(tracing.close)

    if config.tracing is not None:
        app.cleanup_ctx.append(traces)
    app[HOT_PATH] = HotPath(
        exact_paths=frozenset(ROOT_INFERENCE_PATHS + HOT_INFERENCE_PATHS),
        prefix="/v1/",
        not_under_prefix=frozenset(ENGINE_ONLY_PATHS + OWN_ENDPOINTS + tuple(ADMIN_AND_OPEN_PATHS)),
        proxy=lambda: holder["proxy"],
        limits=limits,
        stats=limit_stats,
        gate=gate,
    )

    async def proxy(request: web.Request) -> web.StreamResponse:
        reply = AiohttpReply(request)
        await holder["proxy"].handle(AiohttpRequest(request), reply)
        assert reply.response is not None
        return reply.response

    async def livez(request: web.Request) -> web.Response:
        # a liveness probe: open like /health, but 200 whenever the router answers at all, so that an
        # empty fleet never gets the router restarted (and /metrics can stay an admin route)
        return _json({"status": "alive"})

    async def health(request: web.Request) -> web.Response:
        ready = membership.ready_count()
        body = {
            "status": "ok" if ready else "unavailable",
            "ready": ready,
            "endpoints": len(membership.endpoints()),
        }
        return _json(body, 200 if ready else 503)

    async def models(request: web.Request) -> web.Response:
        cards = membership.model_cards()
        tenant = tenant_of(request)
        if tenant is not None:
            cards = [c for c in cards if tenant.serves(str(c.get("id")))]
        return _json({"object": "list", "data": cards})

    def own_fleet() -> dict[str, Any]:
        now = time.monotonic()
        endpoints = [
            {
                "url": e.url,
                "source": e.source,
                "name": e.name,
                "state": e.state.value,
                "reason": e.reason,
                "since": e.since,
                "last_event_resource_version": e.last_event_version,
                "models": sorted(e.models),
                "adapters": e.adapters,
                "withdrawn": sorted(e.withdrawn_models),
                "in_flight": e.in_flight,
                "requests_sent": e.requests_sent,
                "ejected_until": e.ejected_until_wall(now),
                "routable": e.routable(now),
                "why": e.routing_verdict(now),
                "held": e.held,
                "supervisor": e.supervisor.to_json(now) if e.supervisor is not None else None,
                "prefix_memory": prefix_memory.to_json(e),
                "kv_events": kv_feeds.to_json(e.url) if kv_feeds is not None else None,
                "slow_start": slow_start.to_json(e),
                "group": str(e.group) if e.group is not None else None,
                "traffic": e.traffic.to_json(),
                "load": routing.board.to_json(e.url, now),  # the engine's /metrics, when scraped
                "role": e.role,
                "pairing": e.pairing,
            }
            for e in membership.endpoints()
        ]
        exits = [record.as_json() for record in membership.exits]
        return {
            "policy": config.policy,
            "router_id": config.streams.router_id,
            # with --workers N: the worker that answered (its membership; counters of all, WorkerPages)
            "worker": {"name": worker.name, "of": worker.count} if worker is not None else None,
            "source": source_name(config),
            "endpoints": endpoints,
            "groups": membership.groups.to_json(),
            "left_routing": exits,
            "operation_steps": membership.operation_steps.to_json(),  # the last 20, for the dashboard
            "totals": metrics.totals().to_wire(),
            "model_requests": metrics.model_counts(),  # per model name, kept when engines leave
            "pairs": model_pairs(membership, now),
            "peers": peers_json(),
            "adapter_carry": carry.to_json() if carry is not None else None,
            "flow": flow.gate.to_json() if flow is not None else None,  # --flow-control's queue
        }

    def peers_json() -> dict[str, Any] | None:
        if config.peers is None:
            return None
        return {
            "incarnation": config.peers.incarnation,
            "urls": list(config.peers.urls),
            # with --workers N, worker 1 follows them (and relays to its siblings)
            "following": followers.to_json() if followers.followers else None,
            "refused": peer_access.denied if peer_access is not None else 0,
        }

    async def peer_picks(request: web.Request) -> web.Response:
        assert pick_log is not None
        try:
            after = parse_cursor(request.query.get("after", ""))
        except PeerWireError as exc:
            return error_response(400, f"{PEER_PICKS_PATH}: {exc}", "invalid_request_error")
        return web.Response(body=encode_page(pick_log.page(after)), content_type="application/json")

    worker = config.worker
    pages = (
        WorkerPages(
            worker.name, own_page, own_fleet, worker.socket_path(worker.index), worker.sibling_sockets()
        )
        if worker is not None
        else None
    )

    async def fleet(request: web.Request) -> web.Response:
        return _json(await pages.fleet() if pages is not None else own_fleet())

    async def fleet_view() -> dict[str, Any]:
        return await pages.fleet() if pages is not None else own_fleet()

    dashboard_history = HistoryLoop(fleet_view)  # a point every 5 s for the charts, rollouts followed
    # one read per 0.5 s shared by every open dashboard
    dashboard_feed = DashboardFeed(
        fleet_view, windows=dashboard_history.windows, rollout=dashboard_history.rollout
    )

    async def prometheus(request: web.Request) -> web.Response:
        body = await pages.page() if pages is not None else own_page()
        return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def engine_only(request: web.Request) -> web.Response:
        return error_response(
            404,
            f"{request.path} changes one engine; call that engine's supervisor or server, not the router.",
            "NotFoundError",
        )

    async def not_found(request: web.Request) -> web.Response:
        return error_response(
            404,
            f"The router has no {request.method} {request.path}; it serves the OpenAI POST paths "
            "under /v1, /tokenize, /detokenize, and GET /health, /livez, /metrics, /v1/models, /v1/fleet, "
            f"and a browser's {DASHBOARD_PATH}.",
            "NotFoundError",
        )

    async def root(request: web.Request) -> web.Response:
        # a browser that opens the router's address gets the dashboard; `/` is an admin path
        # (edge/admin_access.py), so it is refused exactly where the dashboard would be
        return to_dashboard() if wants_page(request) else await not_found(request)

    app.router.add_get("/health", health)
    app.router.add_get("/livez", livez)
    app.router.add_get("/metrics", prometheus)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/fleet", fleet)
    app.router.add_get("/", root)
    app.router.add_get(DASHBOARD_PATH, page_handler())
    app.router.add_get("/dashboard/events", dashboard_feed.serve)
    app.router.add_get("/dashboard/series", dashboard_history.serve)
    if pick_log is not None:
        app.router.add_get(PEER_PICKS_PATH, peer_picks)
    for path in ENGINE_ONLY_PATHS:
        app.router.add_post(path, engine_only)
    for path in ROOT_INFERENCE_PATHS + HOT_INFERENCE_PATHS:  # exact paths: one dict lookup to route
        app.router.add_post(path, proxy, expect_handler=expect)
    app.router.add_post("/v1/{tail:.*}", proxy, expect_handler=expect)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")
