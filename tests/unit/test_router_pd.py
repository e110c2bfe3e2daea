"""The router's prefill/decode path in one process: the router app in front of small fake prefill and
decode engines on loopback that speak vLLM's two-leg protocol (a prefill answer carrying
`kv_transfer_params`, a decode leg carrying them back), and misbehave on purpose (refuse, 5xx, cut
before the first byte, answer without a transfer) so each rule of the P/D path is checked exactly. The
same flow against real `corral sim` engines: tests/integration/test_router_pd.py.
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

from corral.engine_state import EngineState
from corral.router.app import MEMBERSHIP, RouterConfig, build_app
from corral.router.membership.endpoint import SupervisorView

MODEL = "m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5}
Behaviour = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FakeEngine:
    """A prefill or decode engine: /v1/models, /version, and POSTs recorded then run by `behaviour`."""

    def __init__(self, name: str, role: str, version: str = "0.32.0") -> None:
        self.name = name
        self.role = role
        self.version = version
        self.bodies: list[dict[str, Any]] = []
        self.behaviour: Behaviour = self.prefill_answer if role == "prefill" else self.decode_answer
        self.gate: asyncio.Event | None = None  # a decode answer waits for it when set
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/version", self.version_info)
        app.router.add_post("/{tail:.*}", self.post)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": MODEL, "object": "model", "root": MODEL}
        return web.json_response({"object": "list", "data": [card]})

    async def version_info(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version})

    async def post(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(orjson.loads(await request.read()))
        return await self.behaviour(request)

    async def prefill_answer(self, request: web.Request) -> web.Response:
        params = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.name,
            "remote_request_id": f"{self.name}-{len(self.bodies)}",
            "remote_block_ids": [1, 2],
            "remote_host": "127.0.0.1",
            "remote_port": 5600,
            "tp_size": 1,
        }
        return web.json_response({"id": "p", "choices": [{"text": "x"}], "kv_transfer_params": params})

    async def decode_answer(self, request: web.Request) -> web.StreamResponse:
        if self.gate is not None:
            await self.gate.wait()
        body = self.bodies[-1]
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(3):
                await resp.write(b"data: " + orjson.dumps({"engine": self.name, "i": i}) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        return web.json_response({"served_by": self.name, "n": len(self.bodies)})

    async def refuse_before_answer(self, request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()
        await asyncio.sleep(0.05)
        return web.Response()

    async def server_error(self, request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "boom", "code": 500}}, status=500)

    async def no_transfer(self, request: web.Request) -> web.Response:
        return web.json_response({"id": "p", "choices": [{"text": "x"}]})


class Fleet:
    def __init__(self, engines: list[FakeEngine], router: TestServer, client: aiohttp.ClientSession) -> None:
        self.engines = engines
        self.router = router
        self.client = client

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router.port}"

    async def post(self, body: dict[str, Any], path: str = "/v1/chat/completions") -> tuple[int, Any, bytes]:
        async with self.client.post(self.url + path, data=orjson.dumps(body)) as resp:
            return resp.status, resp.headers, await resp.read()

    async def metrics(self) -> str:
        async with self.client.get(self.url + "/metrics") as resp:
            return await resp.text()

    async def wait_routable(self, count: int) -> None:
        for _ in range(250):
            async with self.client.get(self.url + "/v1/fleet") as resp:
                endpoints = (await resp.json())["endpoints"]
            if sum(e["routable"] for e in endpoints) == count:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(endpoints)


@contextlib.asynccontextmanager
async def pd_fleet(engines: list[FakeEngine], **config: Any) -> AsyncIterator[Fleet]:
    for e in engines:
        await e.server.start_server()
    settings: dict[str, Any] = {"models_refresh_seconds": 0.1, "request_timeout": 2.0, **config}
    app = build_app(
        RouterConfig(backends=[e.url for e in engines], roles={e.url: e.role for e in engines}, **settings)
    )
    router = TestServer(app, host="127.0.0.1")
    await router.start_server()
    client = aiohttp.ClientSession()
    fleet = Fleet(engines, router, client)
    try:
        await fleet.wait_routable(len(engines))
        yield fleet
    finally:
        await client.close()
        await router.close()
        for e in engines:
            await e.server.close()


def transfer_of(engine: FakeEngine, i: int) -> dict[str, Any]:
    params: dict[str, Any] = engine.bodies[i]["kv_transfer_params"]
    return params


async def test_prefill_leg_then_decode_leg_carrying_the_transfer() -> None:
    prefill, decode = FakeEngine("p0", "prefill"), FakeEngine("d0", "decode")
    async with pd_fleet([prefill, decode]) as f:
        status, _, body = await f.post({**CHAT, "stream_options": {"include_usage": True}})
        assert status == 200 and orjson.loads(body) == {"served_by": "d0", "n": 1}
        leg = prefill.bodies[0]
        assert leg["max_tokens"] == 1 and leg["stream"] is False and "stream_options" not in leg
        assert leg["kv_transfer_params"]["do_remote_decode"] is True
        assert leg["messages"] == CHAT["messages"]
        sent = decode.bodies[0]
        assert sent["max_tokens"] == 5 and sent["stream_options"] == {"include_usage": True}
        assert transfer_of(decode, 0)["remote_engine_id"] == "p0"
        assert transfer_of(decode, 0)["remote_request_id"] == "p0-1"

        status, headers, body = await f.post({**CHAT, "stream": True}, path="/v1/completions")
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        assert body.count(b"data: ") == 4 and body.endswith(b"data: [DONE]\n\n")
        assert prefill.bodies[1]["stream"] is False and decode.bodies[1]["stream"] is True

        membership = f.router.app[MEMBERSHIP]
        held = membership.get(prefill.url)
        assert held is not None and held.transfers_pending == 0
        metrics = await f.metrics()
        assert f'corral_router_pd_pairs_total{{decode="{decode.url}",prefill="{prefill.url}"}} 2.0' in metrics
        assert "corral_router_pd_transfer_seconds_count 2.0" in metrics
        assert "corral_router_pd_prefill_leg_seconds_count 2.0" in metrics
        assert 'corral_router_pd_handoffs_total{mode="params"} 2.0' in metrics


async def test_transfer_is_pending_until_the_decode_leg_answers() -> None:
    prefill, decode = FakeEngine("p0", "prefill"), FakeEngine("d0", "decode")
    decode.gate = asyncio.Event()
    async with pd_fleet([prefill, decode]) as f:
        membership = f.router.app[MEMBERSHIP]
        pending = asyncio.create_task(f.post(CHAT))
        for _ in range(200):
            if decode.bodies:
                break
            await asyncio.sleep(0.01)
        endpoint = membership.get(prefill.url)
        assert endpoint is not None and endpoint.transfers_pending == 1
        decode.gate.set()
        assert (await pending)[0] == 200
        assert endpoint.transfers_pending == 0


async def test_other_paths_of_a_pd_model_are_not_split() -> None:
    prefill, decode = FakeEngine("p0", "prefill"), FakeEngine("d0", "decode")
    async with pd_fleet([prefill, decode], policy="round_robin") as f:
        await f.post({"model": MODEL, "input": "x"}, path="/v1/embeddings")
        sent = prefill.bodies + decode.bodies
        assert len(sent) == 1 and "kv_transfer_params" not in sent[0]


async def test_prefill_engine_down_is_retried_on_another_prefill_engine() -> None:
    down, up, decode = FakeEngine("p0", "prefill"), FakeEngine("p1", "prefill"), FakeEngine("d0", "decode")
    async with pd_fleet([down, up, decode], policy="round_robin", eject_seconds=30.0) as f:
        down.behaviour = down.refuse_before_answer
        results = [await f.post(CHAT) for _ in range(4)]
        assert [r[0] for r in results] == [200] * 4
        assert len(down.bodies) == 1  # ejected after its one failure
        assert [transfer_of(decode, i)["remote_engine_id"] for i in range(4)] == ["p1"] * 4
        metrics = await f.metrics()
        assert 'corral_router_pd_failures_total{leg="prefill",why="upstream"} 1.0' in metrics
        assert "corral_router_retries_total 1.0" in metrics


async def test_prefill_5xx_is_retried_on_another_prefill_engine_then_passed_through() -> None:
    bad, good, decode = FakeEngine("p0", "prefill"), FakeEngine("p1", "prefill"), FakeEngine("d0", "decode")
    bad.behaviour = bad.server_error
    async with pd_fleet([bad, good, decode], policy="round_robin") as f:
        for _ in range(2):
            status, _, body = await f.post(CHAT)
            assert status == 200
        assert len(bad.bodies) == 2 and len(good.bodies) == 2  # each went to p0 first, then to p1
        good.behaviour = good.server_error
        status, _, body = await f.post(CHAT)
        assert status == 500 and orjson.loads(body)["error"]["message"] == "boom"  # the engine's own
        assert len(bad.bodies) == 3 and len(good.bodies) == 3 and len(decode.bodies) == 2
        assert 'corral_router_pd_failures_total{leg="prefill",why="engine_error"} 4.0' in await f.metrics()


async def test_decode_failing_before_its_first_byte_gets_a_fresh_prefill() -> None:
    prefill = FakeEngine("p0", "prefill")
    broken, good = FakeEngine("d0", "decode"), FakeEngine("d1", "decode")
    broken.behaviour = broken.refuse_before_answer
    async with pd_fleet([prefill, broken, good], eject_seconds=30.0) as f:
        for _ in range(30):  # the decode policy breaks ties at random: until it has picked d0 once
            status, _, body = await f.post(CHAT)
            assert status == 200 and orjson.loads(body)["served_by"] == "d1"
            if broken.bodies:
                break
        assert len(broken.bodies) == 1
        # every decode attempt carried a transfer of its own: the retry ran a fresh prefill leg
        assert len(prefill.bodies) == len(broken.bodies) + len(good.bodies)
        ids = [transfer_of(e, i)["remote_request_id"] for e in (broken, good) for i in range(len(e.bodies))]
        assert len(set(ids)) == len(ids)
        endpoint = f.router.app[MEMBERSHIP].get(prefill.url)
        assert endpoint is not None and endpoint.transfers_pending == 0
        assert 'corral_router_pd_failures_total{leg="decode",why="upstream"} 1.0' in await f.metrics()


async def test_decode_5xx_before_any_byte_reached_the_client_gets_a_fresh_prefill() -> None:
    prefill, decode = FakeEngine("p0", "prefill"), FakeEngine("d0", "decode")
    failed_load = decode.server_error

    async def fail_once(request: web.Request) -> web.StreamResponse:
        decode.behaviour = decode.decode_answer
        return await failed_load(request)

    decode.behaviour = fail_once
    async with pd_fleet([prefill, decode]) as f:
        status, _, body = await f.post(CHAT)
        assert status == 200 and orjson.loads(body)["served_by"] == "d0"
        assert len(prefill.bodies) == 2 and len(decode.bodies) == 2
        assert transfer_of(decode, 0)["remote_request_id"] != transfer_of(decode, 1)["remote_request_id"]
        decode.behaviour = decode.server_error  # every time now: the engine's own 5xx once retries are spent
        status, _, body = await f.post(CHAT)
        assert status == 500 and orjson.loads(body)["error"]["message"] == "boom"
        assert len(decode.bodies) == 2 + 3  # the first try and two retries (--max-retries 2)


async def test_prefill_answer_without_params_of_an_unknown_connector_hands_off_through_storage() -> None:
    """A static prefill engine (no supervisor says its connector) that answers without params: a storage
    connector's flow, so the decode leg is the client's body as it came and nothing is pending."""
    prefill, decode = FakeEngine("p0", "prefill"), FakeEngine("d0", "decode")
    prefill.behaviour = prefill.no_transfer
    decode.gate = asyncio.Event()
    async with pd_fleet([prefill, decode]) as f:
        endpoint = f.router.app[MEMBERSHIP].get(prefill.url)
        assert endpoint is not None
        pending = asyncio.create_task(f.post(CHAT))
        for _ in range(200):
            if decode.bodies:
                break
            await asyncio.sleep(0.01)
        assert decode.bodies == [CHAT] and endpoint.transfers_pending == 0
        decode.gate.set()
        status, _, body = await pending
        assert status == 200 and orjson.loads(body)["served_by"] == "d0"
        assert prefill.bodies[0]["max_tokens"] == 1
        metrics = await f.metrics()
        assert 'corral_router_pd_handoffs_total{mode="storage"} 1.0' in metrics
        assert 'mode="params"' not in metrics and "corral_router_pd_failures_total{" not in metrics


async def test_prefill_answer_without_params_of_a_pull_connector_is_502_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client's 502 names no engine (issue 27); the router's log names it and its connector."""
    prefill, decode = FakeEngine("p0", "prefill"), FakeEngine("d0", "decode")
    prefill.behaviour = prefill.no_transfer
    async with pd_fleet([prefill, decode]) as f:
        endpoint = f.router.app[MEMBERSHIP].get(prefill.url)
        assert endpoint is not None
        # as a supervisor's state stream would say it (READY on a live stream, so routing is unchanged)
        endpoint.supervisor = SupervisorView(
            "http://supervisor", link="connected", state=EngineState.READY, epoch=1, connector="NixlConnector"
        )
        status, headers, body = await f.post(CHAT)
        message = orjson.loads(body)["error"]["message"]
        assert status == 502 and prefill.url not in message and "127.0.0.1" not in message
        assert "KV transfer" in message and headers["X-Request-Id"] in message
        logged = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert any(prefill.url in line and "NixlConnector" in line for line in logged), logged
        assert decode.bodies == []
        assert (
            'corral_router_pd_failures_total{leg="prefill",why="no_transfer_params"} 1.0' in await f.metrics()
        )


async def test_a_storage_connectors_params_are_carried_but_nothing_is_pending() -> None:
    """LMCacheMPConnector answers `kv_transfer_params: {}` (carried as no params); a storage connector's
    non-empty params go to the decode engine, but the prefill engine holds nothing for it."""
    prefill, decode = FakeEngine("p0", "prefill"), FakeEngine("d0", "decode")
    async with pd_fleet([prefill, decode]) as f:
        endpoint = f.router.app[MEMBERSHIP].get(prefill.url)
        assert endpoint is not None
        endpoint.supervisor = SupervisorView(
            "http://supervisor",
            link="connected",
            state=EngineState.READY,
            epoch=1,
            connector="LMCacheConnectorV1",
        )
        decode.gate = asyncio.Event()
        pending = asyncio.create_task(f.post(CHAT))
        for _ in range(200):
            if decode.bodies:
                break
            await asyncio.sleep(0.01)
        assert transfer_of(decode, 0)["remote_engine_id"] == "p0" and endpoint.transfers_pending == 0
        decode.gate.set()
        assert (await pending)[0] == 200

        async def empty_params(request: web.Request) -> web.Response:
            return web.json_response({"id": "p", "choices": [{"text": "x"}], "kv_transfer_params": {}})

        prefill.behaviour = empty_params
        assert (await f.post(CHAT))[0] == 200
        assert decode.bodies[1] == CHAT
        assert 'corral_router_pd_handoffs_total{mode="storage"} 2.0' in await f.metrics()


async def test_mismatched_versions_are_never_paired(caplog: pytest.LogCaptureFixture) -> None:
    prefill, decode = FakeEngine("p0", "prefill", "0.32.0"), FakeEngine("d0", "decode", "0.31.0")
    async with pd_fleet([prefill, decode]) as f:
        status, headers, body = await f.post(CHAT)
        assert status == 503 and int(headers["Retry-After"]) >= 1
        message = orjson.loads(body)["error"]["message"]
        assert "no routable decode endpoint can take" in message and prefill.url not in message
        logged = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert any("pairing identity" in line and prefill.url in line for line in logged), logged
        assert prefill.bodies == [] and decode.bodies == []  # no prefill leg for a pair that cannot be


async def test_a_prefill_engine_goes_only_to_the_decode_engine_of_its_version() -> None:
    prefill = FakeEngine("p0", "prefill", "0.32.0")
    old, new = FakeEngine("d-old", "decode", "0.31.0"), FakeEngine("d-new", "decode", "0.32.0")
    async with pd_fleet([prefill, old, new]) as f:
        for _ in range(8):
            status, _, body = await f.post(CHAT)
            assert status == 200 and orjson.loads(body)["served_by"] == "d-new"
        assert old.bodies == []


async def test_no_decode_engine_is_503_naming_why() -> None:
    prefill, decode = FakeEngine("p0", "prefill"), FakeEngine("d0", "decode")
    async with pd_fleet([prefill, decode], eject_seconds=30.0, max_retries=0) as f:
        await decode.server.close()
        status, _, body = await f.post(CHAT)  # the decode leg fails: ejected, not retried
        assert status == 503
        status, _, body = await f.post(CHAT)
        assert status == 503 and "no routable decode endpoint" in orjson.loads(body)["error"]["message"]
