"""Envoy's side of ext_proc, played with Envoy's own protos (xds-protos) over real gRPC against `corral epp`:
one exchange per request in FULL_DUPLEX_STREAMED mode (headers, the body, the picker's answer; then, as the
gateway would, the request sent over real HTTP to the picked `ip:port` and the engine's response headers
and body fed back through the response phases, the served endpoint named in `envoy.lb`).

An exchange can stop after the pick (`Exchange.picked`) and finish later, so a test can hold a request
in flight on an endpoint as the gateway would while the engine works."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
import orjson
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


def http_headers(pairs: dict[str, str], end_of_stream: bool = False) -> ext_proc.HttpHeaders:
    return ext_proc.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
        ),
        end_of_stream=end_of_stream,
    )


def metadata(namespace: str, key: str, value: Any) -> base_pb2.Metadata:
    inner = struct_pb2.Struct()
    inner.update({key: value})
    meta = base_pb2.Metadata()
    meta.filter_metadata[namespace].CopyFrom(inner)
    return meta


@dataclass
class Answer:
    """What the picker answered for the request: a pick, or an immediate response."""

    endpoints: list[str] = field(default_factory=list)  # from `envoy.lb` dynamic metadata
    header: str | None = None  # x-gateway-destination-endpoint as a header mutation
    set_headers: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    body: bytes = b""  # the request body handed back
    immediate_status: int | None = None
    immediate_body: bytes = b""
    immediate_headers: dict[str, str] = field(default_factory=dict)


class Exchange:
    """One ext_proc stream."""

    def __init__(self, stub: ext_proc_grpc.ExternalProcessorStub) -> None:
        self.call = stub.Process()
        self.answer = Answer()

    async def picked(
        self,
        body: dict[str, Any] | bytes,
        path: str = "/v1/completions",
        headers: dict[str, str] | None = None,
        subset: Any = None,
    ) -> Answer:
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        pairs = {":method": "POST", ":path": path, "content-type": "application/json", **(headers or {})}
        first = ext_proc.ProcessingRequest(
            request_headers=http_headers(pairs),
            protocol_config=ext_proc.ProtocolConfiguration(
                request_body_mode=FULL_DUPLEX, response_body_mode=FULL_DUPLEX
            ),
        )
        if subset is not None:
            first.metadata_context.CopyFrom(
                metadata("envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset", subset)
            )
        await self.call.write(first)
        await self.call.write(
            ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=raw, end_of_stream=True))
        )
        answer = self.answer
        reply = await self.call.read()
        if reply.HasField("immediate_response"):
            immediate = reply.immediate_response
            answer.immediate_status = immediate.status.code
            answer.immediate_body = immediate.body
            answer.immediate_headers = {
                h.header.key: h.header.raw_value.decode() for h in immediate.headers.set_headers
            }
            return answer
        assert reply.HasField("request_headers"), reply
        common = reply.request_headers.response
        assert common.clear_route_cache
        mutation = common.header_mutation
        answer.set_headers = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
        answer.removed = list(mutation.remove_headers)
        answer.header = answer.set_headers.get("x-gateway-destination-endpoint")
        lb = reply.dynamic_metadata.fields["envoy.lb"].struct_value
        answer.endpoints = lb.fields["x-gateway-destination-endpoint"].string_value.split(",")
        while True:  # the body handed back, in chunks
            part = await self.call.read()
            streamed = part.request_body.response.body_mutation.streamed_response
            answer.body += streamed.body
            if streamed.end_of_stream:
                break
        return answer

    async def forwarded(
        self, session: aiohttp.ClientSession, path: str = "/v1/completions", served: str | None = None
    ) -> tuple[int, bytes]:
        """Send the picked request to the first endpoint (or `served`, as a gateway falling back would),
        relay the engine's answer through the response phases; the engine's status and body."""
        target = served or self.answer.endpoints[0]
        body = b""
        async with session.post(
            f"http://{target}{path}", data=self.answer.body, headers={"content-type": "application/json"}
        ) as resp:
            await self.response_headers(resp.status, resp.headers.get("content-type", ""), target)
            async for chunk in resp.content.iter_any():
                body += chunk
                await self.response_body(chunk, False)
            await self.response_body(b"", True)
            return resp.status, body

    async def response_headers(self, status: int, content_type: str, served: str) -> None:
        message = ext_proc.ProcessingRequest(
            response_headers=http_headers({":status": str(status), "content-type": content_type}),
            metadata_context=metadata("envoy.lb", "x-gateway-destination-endpoint-served", served),
        )
        await self.call.write(message)
        reply = await self.call.read()
        assert reply.HasField("response_headers"), reply

    async def response_body(self, chunk: bytes, end_of_stream: bool) -> bytes:
        await self.call.write(
            ext_proc.ProcessingRequest(
                response_body=ext_proc.HttpBody(body=chunk, end_of_stream=end_of_stream)
            )
        )
        handed = b""
        while True:
            reply = await self.call.read()
            streamed = reply.response_body.response.body_mutation.streamed_response
            handed += streamed.body
            if streamed.end_of_stream or len(handed) >= len(chunk):
                return handed

    async def close(self) -> None:
        await self.call.done_writing()
        self.call.cancel()


class EnvoySide:
    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = ext_proc_grpc.ExternalProcessorStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def exchange(self) -> Exchange:
        return Exchange(self.stub)

    async def pick(self, body: dict[str, Any] | bytes, **kwargs: Any) -> Answer:
        """A pick alone (the exchange closed after it, as a client that left)."""
        exchange = self.exchange()
        try:
            return await exchange.picked(body, **kwargs)
        finally:
            await exchange.close()

    async def status(self, service: str) -> str:
        reply = await self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    async def close(self) -> None:
        await self.channel.close()
