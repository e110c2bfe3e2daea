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
from tests.support.waits import eventually

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
        await eventually(lambda: scraper.failures > 0, "a failed scrape")
        await eventually(lambda: board.fresh(ready.url) is None, "the load gone stale")
    finally:
        await scraper.stop()
        await server.close()


async def test_a_large_fleet_is_scraped_within_the_budget_spread_over_time() -> None:
    """1,000 READY engines, a budget of 100 scrapes/s: each engine every 10 s (not every interval),
    staleness 5 periods, and a tenth of a second starts ten scrapes, not a burst of a thousand."""
    hits: list[str] = []

    async def metrics(request: web.Request) -> web.Response:
        hits.append(request.match_info["engine"])
        return web.Response(body=METRICS)

    app = web.Application()
    app.router.add_get("/{engine}/metrics", metrics)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    fleet = [
        Endpoint(f"http://127.0.0.1:{server.port}/e{i}", frozenset({"m"}), EngineState.READY)
        for i in range(1000)
    ]
    board = LoadBoard()
    # the background loop's first step starts nothing; the test steps the clock itself
    scraper = LoadScraper(board, lambda: fleet, interval=1.0, budget=100.0, tick=3600.0)
    await scraper.start()
    try:
        # the loop's first step began a round of the 1000 engines (it sets the period they need)
        await eventually(lambda: scraper.period == 10.0, "the background loop's first step")
        assert scraper.step(0.1) == 10
        assert scraper.period == 10.0 and board.stale_after == 50.0
        fleet[10].state = EngineState.STARTING  # left routing: passed over at no cost
        assert scraper.step(0.5) == 50
        for _ in range(200):
            if len(hits) == 60:
                break
            await asyncio.sleep(0.02)
        expected = [f"e{i}" for i in range(61) if i != 10]
        assert sorted(hits, key=lambda e: int(e[1:])) == expected
        assert scraper.step(3600.0) == 939  # a stalled loop catches up at most its round, no further
        assert scraper.step(0.0) == 0
    finally:
        await scraper.stop()
        await server.close()


def test_a_small_fleet_is_scraped_every_interval() -> None:
    scraper = LoadScraper(LoadBoard(), list, interval=1.0, budget=100.0)
    assert scraper.period_for(4) == 1.0 and scraper.period_for(100) == 1.0
    assert scraper.period_for(1000) == 10.0


def test_the_loop_sleeps_until_the_next_scrape_is_due() -> None:
    """Two engines every second: the loop wakes when a scrape is earned (about every half second), not
    every tick; a thousand engines within a budget of 100 scrapes/s: every tick; no engine READY: every
    tick, to find the first soon."""
    board = LoadBoard()
    two = [Endpoint(f"http://10.0.0.{i}:8000", frozenset({"m"}), EngineState.READY) for i in range(2)]
    small = LoadScraper(board, lambda: two, interval=1.0)
    assert small.next_wait() == small.tick  # no round yet
    small.step(0.0)  # the first round: two engines, nothing earned yet
    assert abs(small.next_wait() - 0.5) < 1e-9
    small.step(0.25)  # half a scrape earned
    assert abs(small.next_wait() - 0.25) < 1e-9
    fleet = [
        Endpoint(f"http://10.0.{i // 250}.{i % 250}:8000", frozenset({"m"}), EngineState.READY)
        for i in range(1000)
    ]
    large = LoadScraper(board, lambda: fleet, interval=1.0, budget=100.0)
    large.step(0.0)
    assert large.next_wait() == large.tick
    empty = LoadScraper(board, lambda: [], interval=1.0)
    empty.step(0.0)
    assert empty.next_wait() == empty.tick
