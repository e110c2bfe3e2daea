"""An in-process fleet for the endpoint picker's unit tests and benchmarks: a router core (the one both
front doors build) with N endpoints put READY in its membership, no engine behind them, and the ext_proc
messages one request sends, so a pick can be made through the picker's `Exchange` or at the router's own
seam (membership's eligible set, then the policy) on identical cores."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from corral.engine_state import EngineState
from corral.epp.decision import Picker
from corral.epp.exchange import Exchange
from corral.router.app import RouterConfig
from corral.router.core import RouterCore
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.request import RouteRequest

MODEL = "m"


def engine_url(i: int) -> str:
    return f"http://10.{i // 65536}.{i // 256 % 256}.{i % 256}:8000"


def ready_core(endpoints: int, policy: str = "least_request") -> RouterCore:
    urls = tuple(engine_url(i) for i in range(endpoints))
    core = RouterCore(RouterConfig(backends=urls, policy=policy))
    for url in urls:
        core.membership.add(Endpoint(url, reason="test"), "test")
        core.membership.update(url, "ready", state=EngineState.READY, models=frozenset({MODEL}))
    return core


def messages(body: dict[str, Any], status: int = 200) -> list[ext_proc.ProcessingRequest]:
    """One request's exchange as a gateway sends it: headers, body, response headers, response body."""
    raw = orjson.dumps(body)
    pairs = {":method": "POST", ":path": "/v1/completions", "content-type": "application/json"}
    head = ext_proc.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
        )
    )
    answer = ext_proc.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=":status", raw_value=str(status).encode())]
        )
    )
    return [
        ext_proc.ProcessingRequest(request_headers=head),
        ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=raw, end_of_stream=True)),
        ext_proc.ProcessingRequest(response_headers=answer),
        ext_proc.ProcessingRequest(response_body=ext_proc.HttpBody(body=b"{}", end_of_stream=True)),
    ]


async def epp_pick(core: RouterCore, picker: Picker, body: dict[str, Any]) -> str:
    """The `ip:port` the picker answers for `body`, the whole exchange run (response phases included)."""

    async def sent() -> AsyncIterator[ext_proc.ProcessingRequest]:
        for message in messages(body):
            yield message

    picked = ""
    async for answer in Exchange(picker, core.metrics, 1 << 24).run(sent()):
        if answer.HasField("dynamic_metadata"):
            lb = answer.dynamic_metadata.fields["envoy.lb"].struct_value
            picked = lb.fields["x-gateway-destination-endpoint"].string_value.split(",")[0]
    return picked


def router_pick(core: RouterCore, body: dict[str, Any]) -> Endpoint:
    """The router's own pick at its seam (as its proxy makes it): the eligible set, then the policy."""
    route = RouteRequest(MODEL, {}, body)
    return core.routing.policy.pick(core.membership.eligible(MODEL), route)
