"""The background scraper: fills the load board from each READY engine's /metrics, skips engines that
are not READY, and lets an engine that stops answering go stale (saturated for the scorers)."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.load_board import LoadBoard
from corral.router.routing.load_scraper import LoadScraper

METRICS = b'vllm:num_requests_running{model_name="m"} 2.0\nvllm:num_requests_waiting{model_name="m"} 1.0\n'


async def test_scraper_fills_the_board_and_failures_age_into_staleness() -> None:
    answering = {"ok": True}

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=METRICS) if answering["ok"] else web.Response(status=500)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    ready = Endpoint(f"http://127.0.0.1:{server.port}", frozenset({"m"}), EngineState.READY)
    starting = Endpoint("http://127.0.0.1:1", frozenset({"m"}), EngineState.STARTING)
    board = LoadBoard(stale_after=0.3)
    scraper = LoadScraper(board, lambda: [ready, starting], interval=0.05)
    await scraper.start()
    try:
        for _ in range(100):
            if board.fresh(ready.url) is not None:
                break
            await asyncio.sleep(0.02)
        load = board.fresh(ready.url)
        assert load is not None and (load.running, load.waiting) == (2.0, 1.0)
        assert starting.url not in board.loads  # not READY: not scraped
        answering["ok"] = False
        await asyncio.sleep(0.6)
        assert board.fresh(ready.url) is None
        assert scraper.failures > 0
    finally:
        await scraper.stop()
        await server.close()
