"""The endpoint picker's process: the router's core started (membership, supervisor streams and their
acknowledgements, policies), the ext_proc service and gRPC health on the gRPC port, and an HTTP port for
the kubelet and Prometheus (`/livez`, `/health` open; `/metrics` and `/v1/fleet` behind the router's
admin rule), until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import orjson
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from prometheus_client import CollectorRegistry, generate_latest

from corral.epp.decision import Picker
from corral.epp.exchange import Exchange
from corral.router.app import METRICS_CONTENT_TYPE, RouterConfig
from corral.router.core import RouterCore
from corral.router.edge.admin_access import AdminAccess
from corral.router.edge.tenants import TenantCollector, TenantGate, Tenants
from corral.router.telemetry.endpoint_series import endpoint_series
from corral.router.telemetry.metrics import RouterCollector

log = logging.getLogger("corral.epp")

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
# The health services the protocol names: liveness (the process answers), readiness and the ext_proc
# service (something routable: the picker can pick), and the server's overall status ("").
LIVENESS, READINESS = "liveness", "readiness"
READY_SERVICES = (READINESS, EXT_PROC_SERVICE, "")
HEALTH_REFRESH_SECONDS = 0.5
MAX_GRPC_MESSAGE_BYTES = 8 * 1024 * 1024  # one ext_proc message (a body chunk is at most the gateway's)


@dataclass(frozen=True, slots=True)
class EppConfig:
    core: RouterConfig
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 9002
    host: str = "127.0.0.1"  # the HTTP port: probes and metrics
    port: int = 9003
    fallbacks: int = 2  # endpoints after the pick in x-gateway-destination-endpoint
    max_body_bytes: int = 16 * 1024 * 1024  # a request body read for the pick


class ExternalProcessor(ext_proc_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, picker: Picker, core: RouterCore, max_body_bytes: int) -> None:
        self._picker = picker
        self._core = core
        self._max_body = max_body_bytes

    async def Process(
        self, requests: AsyncIterator[ext_proc.ProcessingRequest], context: Any
    ) -> AsyncIterator[ext_proc.ProcessingResponse]:
        # an async generator itself: grpc.aio streams a method's answers only when it is one
        async for response in Exchange(self._picker, self._core.metrics, self._max_body).run(requests):
            yield response


class EndpointPicker:
    """Built from an EppConfig; `start` listens, `stop` ends the exchanges within `grace` seconds."""

    def __init__(self, config: EppConfig) -> None:
        self.config = config
        self.core = RouterCore(config.core)
        tenants = Tenants.from_file(config.core.api_keys_file) if config.core.api_keys_file else None
        self.tenants = tenants
        gate = TenantGate(tenants) if tenants is not None else None
        self.picker = Picker(self.core, gate, config.fallbacks)
        self.health = health_aio.HealthServicer()
        self._grpc: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._registry = CollectorRegistry(auto_describe=False)
        slow_start = self.core.routing.slow_start
        self._registry.register(
            RouterCollector(
                self.core.metrics,
                self.core.membership.endpoints,
                slow_start.weights if slow_start.enabled else None,
            )
        )
        if gate is not None:
            self._registry.register(TenantCollector(gate))
        self.grpc_port = config.grpc_port
        self.port = config.port

    async def start(self) -> None:
        await self.core.start()
        if self.tenants is not None:
            await self.tenants.start()
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        await self._set_ready()
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
            ]
        )
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(
            ExternalProcessor(self.picker, self.core, self.config.max_body_bytes), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        self.grpc_port = server.add_insecure_port(f"{self.config.grpc_host}:{self.config.grpc_port}")
        await server.start()
        self._grpc = server
        self._http = web.AppRunner(self._http_app(), access_log=None)
        await self._http.setup()
        site = web.TCPSite(self._http, self.config.host, self.config.port)
        await site.start()
        self.port = int(self._http.addresses[0][1])
        self._refresh = asyncio.create_task(self._keep_health(), name="corral-epp-health")

    async def stop(self, grace: float) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
        for service in (*READY_SERVICES, LIVENESS):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._grpc is not None:
            await self._grpc.stop(grace)
        if self._http is not None:
            await self._http.cleanup()
        if self.tenants is not None:
            await self.tenants.stop()
        await self.core.stop()

    async def _set_ready(self) -> None:
        ready = self.core.membership.ready_count() > 0
        status = (
            health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in READY_SERVICES:
            await self.health.set(service, status)

    async def _keep_health(self) -> None:
        """Readiness follows membership (which has no event for "something became routable")."""
        while True:
            await asyncio.sleep(HEALTH_REFRESH_SECONDS)
            await self._set_ready()

    def _http_app(self) -> web.Application:
        admin = AdminAccess(self.config.core.admin)
        membership = self.core.membership

        @web.middleware
        async def guarded(request: web.Request, handler: Any) -> web.StreamResponse:
            refused = admin.refuse(request)
            return refused if refused is not None else await handler(request)

        async def livez(request: web.Request) -> web.Response:
            return _json({"status": "alive"})

        async def health(request: web.Request) -> web.Response:
            ready = membership.ready_count()
            body = {"status": "ok" if ready else "unavailable", "ready": ready}
            return _json(body, 200 if ready else 503)

        async def metrics(request: web.Request) -> web.Response:
            page = generate_latest(self._registry) + endpoint_series(membership.endpoints())
            return web.Response(body=page, headers={"Content-Type": METRICS_CONTENT_TYPE})

        async def fleet(request: web.Request) -> web.Response:
            return _json(
                {
                    "router_id": self.config.core.streams.router_id,
                    "policy": self.config.core.policy,
                    "endpoints": [
                        {
                            "url": e.url,
                            "address": self.picker.address(e),
                            "state": e.state.value,
                            "routable": e.in_routing,
                            "in_flight": e.in_flight,
                            "dispatching": e.dispatching,
                            "requests_sent": e.requests_sent,
                            "role": e.role,
                            "group": str(e.group) if e.group is not None else None,
                            "supervisor": e.supervisor.to_json(time.monotonic())
                            if e.supervisor is not None
                            else None,
                            "traffic": e.traffic.to_json(),
                        }
                        for e in membership.endpoints()
                    ],
                }
            )

        app = web.Application(middlewares=[guarded])
        app.router.add_get("/livez", livez)
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/v1/fleet", fleet)
        return app


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


async def serve(config: EppConfig, shutdown_timeout: float) -> None:
    """Run the endpoint picker until SIGTERM/SIGINT."""
    picker = EndpointPicker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await picker.start()
        log.info(
            "corral epp ready: ext_proc on %s:%d, probes and metrics on http://%s:%d "
            "(router id %s, policy %s)",
            config.grpc_host,
            picker.grpc_port,
            config.host,
            picker.port,
            config.core.streams.router_id,
            config.core.policy,
        )
        await stop.wait()
        log.info("corral epp stopping")
    finally:
        await picker.stop(shutdown_timeout)
