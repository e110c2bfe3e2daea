"""The simulator's own count of connections carrying a request (what shutdown leaves open)."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from corral.sim.http.connections import BusyConnections


async def test_a_connection_is_busy_from_request_until_its_answer_is_written() -> None:
    busy = BusyConnections()
    seen: list[bool] = []
    connections: list[object] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(busy.carries_request(request.protocol))
        connections.append(request.protocol)
        return web.Response(text="ok")

    async def missing(request: web.Request) -> web.Response:
        seen.append(busy.carries_request(request.protocol))
        raise web.HTTPNotFound(text="no")

    app = web.Application(middlewares=[busy.middleware])
    app.router.add_get("/", answer)
    app.router.add_get("/missing", missing)
    server = TestServer(app)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{server.port}/") as resp:
                assert resp.status == 200 and await resp.text() == "ok"
            async with client.get(f"http://127.0.0.1:{server.port}/missing") as resp:
                assert resp.status == 404 and await resp.text() == "no"
        assert seen == [True, True]
        assert not busy.carries_request(connections[0])  # idle again once answered
    finally:
        await server.close()
