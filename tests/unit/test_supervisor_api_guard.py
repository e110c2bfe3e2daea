"""The management API's guard on its own: which Host names count as this machine, and the order and
wording of its refusals (real HTTP to an in-process app)."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from corral.supervisor.http.api_guard import ManagementGuard, loopback_host


def test_loopback_hosts() -> None:
    for host in (
        "127.0.0.1",
        "127.0.0.1:8081",
        "127.3.2.1:1",
        "localhost",
        "LOCALHOST:80",
        "[::1]:8081",
        "::1",
    ):
        assert loopback_host(host), host
    for host in (
        "evil.example",
        "evil.example:8081",
        "10.0.0.1:8081",
        "[2001:db8::1]:80",
        "",
        "localhost.evil",
    ):
        assert not loopback_host(host), host


async def serve(token: str | None) -> TestServer:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application(middlewares=[ManagementGuard(token).middleware])
    app.router.add_route("*", "/v1/{tail:.*}", ok)
    app.router.add_get("/livez", ok)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


@pytest.mark.parametrize(
    ("headers", "status", "says"),
    [
        ({"Content-Type": "application/json"}, 200, None),
        ({"Content-Type": "Application/JSON; charset=utf-8"}, 200, None),
        ({"Content-Type": "text/plain"}, 415, "not Content-Type 'text/plain'"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "'application/json'"),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 415, "multipart/form-data"),
        ({"Content-Type": "x" * 300}, 415, "..."),
        (
            {"Content-Type": "application/json", "Origin": "https://evil.example"},
            403,
            "'https://evil.example'",
        ),
        ({"Content-Type": "text/plain", "Origin": "null"}, 403, "takes no requests from web pages"),
    ],
)
async def test_tokenless_refusals(headers: dict[str, str], status: int, says: str | None) -> None:
    server = await serve(None)
    try:
        async with (
            aiohttp.ClientSession(skip_auto_headers=("Content-Type",)) as session,
            session.post(server.make_url("/v1/drain"), data=b"{}", headers=headers) as resp,
        ):
            body = await resp.json()
            assert resp.status == status, body
            if says is not None:
                assert says in body["error"]["message"] and body["error"]["code"] == status
                assert len(body["error"]["message"]) < 400
    finally:
        await server.close()


async def test_with_a_token_the_order_is_origin_then_token_then_content_type() -> None:
    server = await serve("t0k")
    url = server.make_url("/v1/drain")
    try:
        async with aiohttp.ClientSession(skip_auto_headers=("Content-Type",)) as s:

            async def status(headers: dict[str, str]) -> int:
                async with s.post(url, data=b"{}", headers=headers) as resp:
                    return resp.status

            assert await status({"Origin": "http://x", "Content-Type": "text/plain"}) == 403
            assert await status({"Content-Type": "text/plain"}) == 401
            assert await status({"Authorization": "Bearer nope", "Content-Type": "application/json"}) == 401
            assert await status({"Authorization": "Bearer t0k", "Content-Type": "text/plain"}) == 415
            assert await status({"Authorization": "Bearer t0k", "Content-Type": "application/json"}) == 200
            assert await status({"Authorization": "Bearer tök", "Content-Type": "application/json"}) == 401
            async with s.get(server.make_url("/livez"), headers={"Origin": "http://x"}) as resp:
                assert resp.status == 200  # probes are open to everyone
    finally:
        await server.close()
