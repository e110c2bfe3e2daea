"""The router's aiohttp application: its own endpoints (/health, /metrics, /v1/models, /v1/fleet)
and the OpenAI paths handed to the proxy, with the shared upstream session and the membership
source started and stopped with the app."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from corral.openai_errors import error_response
from corral.router.membership import Membership
from corral.router.metrics import RouterCollector, RouterMetrics
from corral.router.policies import build_policy
from corral.router.proxy import Proxy, ProxyConfig
from corral.router.static_source import StaticSource

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
# Per-engine management calls: sending them to one engine picked at random would be wrong.
ENGINE_ONLY_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")

CLIENT_MAX_SIZE = 64 * 1024 * 1024
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class RouterConfig:
    backends: Sequence[str]
    policy: str = "round_robin"
    session_header: str = "x-session-id"
    max_retries: int = 2
    eject_seconds: float = 5.0
    models_refresh_seconds: float = 5.0
    request_timeout: float | None = 300.0
    connect_timeout: float = 5.0
    probe_timeout: float = 2.0


MEMBERSHIP = web.AppKey("membership", Membership)
SOURCE = web.AppKey("source", StaticSource)
METRICS = web.AppKey("metrics", RouterMetrics)


def build_app(config: RouterConfig) -> web.Application:
    app = web.Application(client_max_size=CLIENT_MAX_SIZE)
    membership = Membership()
    metrics = RouterMetrics()
    source = StaticSource(membership, config.backends, config.models_refresh_seconds, config.probe_timeout)
    app[MEMBERSHIP] = membership
    app[SOURCE] = source
    app[METRICS] = metrics
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RouterCollector(metrics, membership.endpoints))
    holder: dict[str, Proxy] = {}

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=0, limit_per_host=0, keepalive_timeout=4.0, ttl_dns_cache=300
            ),
            # sock_read bounds every silence of the backend: before the first byte (then the
            # proxy ejects and retries) and between chunks (then the stream ends with an error).
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=config.connect_timeout, sock_read=config.request_timeout
            ),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
        )
        holder["proxy"] = Proxy(
            membership,
            build_policy(config.policy, config.session_header),
            session,
            metrics,
            ProxyConfig(config.max_retries, config.eject_seconds, config.models_refresh_seconds),
        )
        await source.start()
        try:
            yield
        finally:
            await source.stop()
            await session.close()

    app.cleanup_ctx.append(lifecycle)

    async def proxy(request: web.Request) -> web.StreamResponse:
        return await holder["proxy"].handle(request)

    async def health(request: web.Request) -> web.Response:
        ready = membership.ready_count()
        body = {
            "status": "ok" if ready else "unavailable",
            "ready": ready,
            "endpoints": len(membership.endpoints()),
        }
        return _json(body, 200 if ready else 503)

    async def models(request: web.Request) -> web.Response:
        return _json({"object": "list", "data": membership.model_cards()})

    async def fleet(request: web.Request) -> web.Response:
        now = time.monotonic()
        endpoints = [
            {
                "url": e.url,
                "state": e.state.value,
                "reason": e.reason,
                "since": e.since,
                "models": sorted(e.models),
                "in_flight": e.in_flight,
                "ejected_until": e.ejected_until_wall(now),
                "routable": e.routable(now),
            }
            for e in membership.endpoints()
        ]
        return _json({"policy": config.policy, "endpoints": endpoints})

    async def prometheus(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": METRICS_CONTENT_TYPE})

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
            "under /v1, /tokenize, /detokenize, and GET /health, /metrics, /v1/models, /v1/fleet.",
            "NotFoundError",
        )

    app.router.add_get("/health", health)
    app.router.add_get("/metrics", prometheus)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/fleet", fleet)
    for path in ENGINE_ONLY_PATHS:
        app.router.add_post(path, engine_only)
    for path in ROOT_INFERENCE_PATHS:
        app.router.add_post(path, proxy)
    app.router.add_post("/v1/{tail:.*}", proxy)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")
