"""The proxy data path in one process: the router app in front of small fake engines on loopback.

The fakes misbehave on purpose (refuse, hang, cut a stream) so that each failure rule of the
proxy is checked exactly; the same rules are checked against real `corral sim` processes in
tests/integration/test_router_*.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from corral.router.app import RouterConfig, build_app

MODEL = "m"
Behaviour = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FakeEngine:
    """Serves /v1/models for MODEL; POSTs run `behaviour` (default: echo the request as JSON)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.behaviour: Behaviour = self.echo
        self.posts = 0
        self.finished = asyncio.Event()
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/{tail:.*}", self.post)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def post(self, request: web.Request) -> web.StreamResponse:
        self.posts += 1
        try:
            return await self.behaviour(request)
        finally:
            self.finished.set()

    async def echo(self, request: web.Request) -> web.Response:
        raw = await request.read()
        return web.json_response(
            {
                "served_by": self.name,
                "path": request.path_qs,
                "request_id": request.headers.get("x-request-id"),
                "body": raw.decode(),
            },
            headers={"X-Engine": self.name},
        )

    async def stream(self, request: web.Request, chunks: int = 3, gap: float = 0.0) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        for i in range(chunks):
            await resp.write(b"data: " + orjson.dumps({"engine": self.name, "i": i}) + b"\n\n")
            await asyncio.sleep(gap)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def cut_after_first_chunk(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"i": 0}\n\n')
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return resp

    async def hang(self, request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def headers_then_silence(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(3600)
        return resp

    async def bad_request(self, request: web.Request) -> web.Response:
        body = b'{"error":{"message":"too long","type":"BadRequestError","param":"messages","code":400}}'
        return web.Response(status=400, body=body, content_type="application/json")


class Fleet:
    def __init__(self, engines: list[FakeEngine], router: TestServer, client: aiohttp.ClientSession) -> None:
        self.engines = engines
        self.router = router
        self.client = client

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router.port}"

    async def post(
        self, body: bytes | dict[str, Any], path: str = "/v1/chat/completions", **kw: Any
    ) -> tuple[int, CIMultiDict[str], bytes]:
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        async with self.client.post(self.url + path, data=data, **kw) as resp:
            return resp.status, CIMultiDict(resp.headers), await resp.read()

    async def fleet(self) -> list[dict[str, Any]]:
        async with self.client.get(self.url + "/v1/fleet") as resp:
            payload: dict[str, Any] = await resp.json()
            return list(payload["endpoints"])

    async def wait_routable(self, count: int) -> None:
        for _ in range(200):
            if sum(e["routable"] for e in await self.fleet()) == count:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(await self.fleet())


@contextlib.asynccontextmanager
async def fleet_of(n: int, **config: Any) -> AsyncIterator[Fleet]:
    engines = [FakeEngine(f"e{i}") for i in range(n)]
    for e in engines:
        await e.server.start_server()
    settings: dict[str, Any] = {"models_refresh_seconds": 0.1, "request_timeout": 1.0, **config}
    router = TestServer(
        build_app(RouterConfig(backends=[e.url for e in engines], **settings)), host="127.0.0.1"
    )
    await router.start_server()
    client = aiohttp.ClientSession()
    fleet = Fleet(engines, router, client)
    try:
        await fleet.wait_routable(n)
        yield fleet
    finally:
        await client.close()
        await router.close()
        for e in engines:
            await e.server.close()


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


async def test_body_is_forwarded_unchanged_and_request_id_propagated() -> None:
    async with fleet_of(1) as f:
        raw = b'{ "model" : "m",  "messages": [], "extra": 1.50 }'
        status, headers, body = await f.post(
            raw, path="/v1/chat/completions?x=1", headers={"X-Request-Id": "abc"}
        )
        assert status == 200
        echoed = orjson.loads(body)
        assert echoed["body"] == raw.decode()
        assert echoed["path"] == "/v1/chat/completions?x=1"
        assert echoed["request_id"] == "abc"
        assert headers["X-Request-Id"] == "abc", headers
        assert headers["X-Engine"] == "e0"
        assert headers["Content-Type"].startswith("application/json")

        status, headers, body = await f.post(CHAT)
        generated = headers["X-Request-Id"]
        assert len(generated) == 32 and int(generated, 16) >= 0
        assert orjson.loads(body)["request_id"] == generated


async def test_root_paths_are_forwarded_and_engine_only_paths_refused() -> None:
    async with fleet_of(1) as f:
        for path in ("/tokenize", "/detokenize", "/v1/completions", "/v1/embeddings"):
            status, _, body = await f.post({"model": MODEL, "prompt": "x"}, path=path)
            assert status == 200 and orjson.loads(body)["path"] == path
        status, _, body = await f.post({"lora_name": "a"}, path="/v1/load_lora_adapter")
        assert status == 404 and f.engines[0].posts == 4
        async with f.client.get(f.url + "/v1/nothing") as resp:
            assert resp.status == 404 and (await resp.json())["error"]["type"] == "NotFoundError"


async def test_request_errors_answered_in_vllm_shape() -> None:
    async with fleet_of(1) as f:
        status, _, body = await f.post(b'{"model": "m", ')
        err = orjson.loads(body)["error"]
        assert status == 400 and err["type"] == "Bad Request" and err["code"] == 400

        status, _, body = await f.post(b"[1, 2]")
        assert status == 400 and orjson.loads(body)["error"]["type"] == "Bad Request"

        status, _, body = await f.post({"model": "nope", "messages": []})
        assert status == 404
        assert orjson.loads(body) == {
            "error": {
                "message": "The model `nope` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
        }

        status, _, body = await f.post({"model": 3})
        assert status == 400 and orjson.loads(body)["error"]["param"] == "model"

        # No model named and only one served: routed there, as vLLM would serve its only model.
        status, _, _ = await f.post({"messages": []})
        assert status == 200
        assert f.engines[0].posts == 1


async def test_upstream_errors_pass_through_unchanged() -> None:
    async with fleet_of(1) as f:
        f.engines[0].behaviour = f.engines[0].bad_request
        status, headers, body = await f.post(CHAT)
        assert status == 400
        assert (
            body == b'{"error":{"message":"too long","type":"BadRequestError","param":"messages","code":400}}'
        )
        assert headers["Content-Type"].startswith("application/json")


async def test_streams_are_relayed_chunk_by_chunk() -> None:
    async with fleet_of(1) as f:
        e = f.engines[0]

        async def slow(request: web.Request) -> web.StreamResponse:
            return await e.stream(request, chunks=3, gap=0.3)

        e.behaviour = slow
        arrivals: list[bytes] = []
        async with f.client.post(
            f.url + "/v1/chat/completions", data=orjson.dumps({**CHAT, "stream": True})
        ) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            async for chunk in resp.content.iter_any():
                arrivals.append(chunk)
        body = b"".join(arrivals)
        assert body.endswith(b"data: [DONE]\n\n") and body.count(b"data: ") == 4
        # Chunks 0.3 s apart at the engine arrive separately: nothing buffered them.
        assert len(arrivals) >= 3


async def test_refused_connection_before_any_byte_is_retried_elsewhere_and_ejected() -> None:
    async with fleet_of(2, policy="round_robin", eject_seconds=30.0) as f:
        dead_url = f.engines[0].url
        await f.engines[0].server.close()
        statuses = [(await f.post(CHAT))[0] for _ in range(6)]
        assert statuses == [200] * 6
        state = {e["url"]: e for e in await f.fleet()}
        assert state[dead_url]["routable"] is False and state[dead_url]["ejected_until"] is not None
        metrics = await (await f.client.get(f.url + "/metrics")).text()
        assert "corral_router_retries_total 1.0" in metrics
        assert "corral_router_ejections_total 1.0" in metrics


async def test_silent_backend_times_out_and_requests_go_elsewhere() -> None:
    async with fleet_of(2, policy="round_robin", request_timeout=0.5, eject_seconds=30.0) as f:
        hung, healthy = f.engines
        hung.behaviour = hung.hang
        results = await asyncio.gather(*(f.post(CHAT) for _ in range(4)))
        assert [r[0] for r in results] == [200] * 4
        assert all(orjson.loads(r[2])["served_by"] == healthy.name for r in results)
        assert hung.posts == 2  # round robin sent it half, all at once, before any timed out
        for _ in range(4):  # ejected now: not tried again, no wait
            status, _, body = await f.post(CHAT)
            assert status == 200 and orjson.loads(body)["served_by"] == healthy.name
        assert hung.posts == 2


async def test_headers_without_a_first_chunk_still_retry() -> None:
    async with fleet_of(2, policy="round_robin", request_timeout=0.5) as f:
        f.engines[0].behaviour = f.engines[0].headers_then_silence
        status, _, body = await f.post({**CHAT, "stream": True})
        assert status == 200 and orjson.loads(body)["served_by"] == "e1"


async def test_stream_cut_after_first_byte_ends_with_error_event_and_no_replay() -> None:
    async with fleet_of(2, policy="round_robin") as f:
        cut, other = f.engines
        cut.behaviour = cut.cut_after_first_chunk
        status, headers, body = await f.post({**CHAT, "stream": True}, headers={"X-Request-Id": "r1"})
        assert status == 200 and headers["X-Request-Id"] == "r1"
        assert body.startswith(b'data: {"i": 0}\n\n')
        events = [e for e in body.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        error = orjson.loads(events[-2].removeprefix(b"data: "))["error"]
        assert error["code"] == 502 and "r1" in error["message"]
        assert other.posts == 0  # never replayed


async def test_client_disconnect_cancels_the_upstream_request() -> None:
    async with fleet_of(1) as f:
        e = f.engines[0]

        async def endless(request: web.Request) -> web.StreamResponse:
            return await e.stream(request, chunks=10_000, gap=0.02)

        e.behaviour = endless
        async with f.client.post(
            f.url + "/v1/chat/completions", data=orjson.dumps({**CHAT, "stream": True})
        ) as resp:
            await resp.content.readany()
            resp.close()
        await asyncio.wait_for(e.finished.wait(), timeout=5.0)
        for _ in range(50):
            if (await f.fleet())[0]["in_flight"] == 0:
                break
            await asyncio.sleep(0.02)
        assert (await f.fleet())[0]["in_flight"] == 0


async def test_no_eligible_endpoint_is_503_with_retry_after() -> None:
    async with fleet_of(1, eject_seconds=30.0, max_retries=0) as f:
        await f.engines[0].server.close()
        status, headers, body = await f.post(CHAT)
        assert status == 503 and int(headers["Retry-After"]) >= 1
        assert orjson.loads(body)["error"]["code"] == 503
        status, headers, _ = await f.post(CHAT)
        assert status == 503 and 25 <= int(headers["Retry-After"]) <= 30


async def test_router_endpoints() -> None:
    async with fleet_of(2) as f:
        async with f.client.get(f.url + "/health") as resp:
            assert resp.status == 200 and (await resp.json())["ready"] == 2
        async with f.client.get(f.url + "/v1/models") as resp:
            models = await resp.json()
        assert models == {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
        fleet = await f.fleet()
        assert {e["url"] for e in fleet} == {e.url for e in f.engines}
        for e in fleet:
            assert e["state"] == "READY" and e["models"] == [MODEL] and e["in_flight"] == 0
            assert isinstance(e["since"], float) and e["reason"]
        await f.post(CHAT)
        async with f.client.get(f.url + "/metrics") as resp:
            text = await resp.text()
        for name in (
            "corral_router_requests_total",
            "corral_router_errors_total",
            "corral_router_retries_total",
            "corral_router_endpoint_in_flight",
            "corral_router_request_duration_seconds_bucket",
            "corral_router_ttft_seconds_bucket",
            "corral_router_ejections_total",
        ):
            assert name in text
        assert 'corral_router_requests_total{code="200",model="m"} 1.0' in text


async def test_health_is_503_when_nothing_is_ready() -> None:
    router = TestServer(build_app(RouterConfig(backends=["http://127.0.0.1:9"], models_refresh_seconds=0.1)))
    await router.start_server()
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{router.port}/health") as resp:
                assert resp.status == 503
            async with client.post(
                f"http://127.0.0.1:{router.port}/v1/completions", data=b'{"model":"m"}'
            ) as resp:
                assert resp.status == 503 and "Retry-After" in resp.headers
            async with client.get(f"http://127.0.0.1:{router.port}/v1/fleet") as resp:
                (endpoint,) = (await resp.json())["endpoints"]
                assert endpoint["state"] == "STARTING" and endpoint["routable"] is False
                assert "waiting for /v1/models" in endpoint["reason"]
    finally:
        await router.close()


@pytest.mark.parametrize("policy", ["round_robin", "least_request", "session"])
async def test_every_policy_serves(policy: str) -> None:
    async with fleet_of(2, policy=policy) as f:
        results = await asyncio.gather(*(f.post(CHAT, headers={"x-session-id": "s"}) for _ in range(6)))
        assert [r[0] for r in results] == [200] * 6


async def test_session_policy_keeps_a_session_on_one_engine() -> None:
    async with fleet_of(2, policy="session") as f:
        for session in ("alice", "bob", "carol"):
            served = {
                orjson.loads((await f.post(CHAT, headers={"X-Session-Id": session}))[2])["served_by"]
                for _ in range(5)
            }
            assert len(served) == 1, (session, served)
        homes = set()
        for i in range(20):
            homes.add(
                orjson.loads((await f.post(CHAT, headers={"x-session-id": f"user-{i}"}))[2])["served_by"]
            )
        assert homes == {"e0", "e1"}


async def test_retry_after_with_nothing_ejected_is_the_proxy_default_not_the_models_refresh() -> None:
    # ProxyConfig was built positionally and --models-refresh-seconds landed in retry_after_seconds.
    router = TestServer(build_app(RouterConfig(backends=["http://127.0.0.1:9"], models_refresh_seconds=0.1)))
    await router.start_server()
    try:
        async with aiohttp.ClientSession() as client:
            async with client.post(
                f"http://127.0.0.1:{router.port}/v1/completions", data=b'{"model":"m"}'
            ) as resp:
                assert resp.status == 503 and resp.headers["Retry-After"] == "5"
    finally:
        await router.close()
