"""An engine's `/metrics` page is untrusted input (issue 27): a hostile engine on loopback streaming a
1 GiB page, one endless line, or a page of a million lines costs that engine its scrape only (counted,
logged once), while an honest engine beside it is scraped as before; a real vLLM page passes the bounds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.routing import load_scraper
from corral.router.routing.load_board import LoadBoard
from corral.router.routing.load_scraper import LoadScraper, PageRefused, parse_engine_metrics
from corral.router.telemetry.engine_input import METRICS_PAGE

HONEST = b'vllm:num_requests_running{model_name="m"} 2.0\nvllm:num_requests_waiting{model_name="m"} 1.0\n'
REAL_PAGE = Path(__file__).parents[1] / "data" / "vllm-samples" / "metrics.body"

Body = Callable[[asyncio.StreamWriter], Awaitable[None]]


async def _gigabyte(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
    chunk = b"vllm:num_requests_running 1\n" * 4096
    for _ in range((1 << 30) // len(chunk)):
        writer.write(chunk)
        await writer.drain()


async def _endless_line(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b'vllm:num_requests_running{x="' + b"a" * 65536
    while True:
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
        chunk = b"a" * 65536


def _page(data: bytes) -> Body:
    async def send(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
        await writer.drain()

    return send


async def _serve(body: Body) -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                await body(writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (_gigabyte, "too_large"),
        (_endless_line, "too_large"),
        (_page(b"vllm:other 1\n" * 200_000), "too_many_lines"),
        (_page(b'vllm:num_requests_running{x="' + b"a" * (100 << 10) + b'"} 1\n'), "line_too_long"),
    ],
)
async def test_a_hostile_page_costs_its_engine_the_scrape_only(
    body: Body, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    hostile, hostile_url = await _serve(body)
    honest, honest_url = await _serve(_page(HONEST))
    endpoints = [Endpoint(u, frozenset({"m"}), EngineState.READY) for u in (hostile_url, honest_url)]
    board = LoadBoard(stale_after=5.0)
    scraper = LoadScraper(board, lambda: endpoints, interval=0.05, timeout=10.0)
    caplog.set_level(logging.WARNING, "corral.router.engine_metrics")
    await scraper.start()
    try:
        for _ in range(1000):
            if scraper.refusals.refused.get((METRICS_PAGE, reason), 0) >= 2 and board.fresh(honest_url):
                break
            await asyncio.sleep(0.02)
        assert scraper.refusals.refused.get((METRICS_PAGE, reason), 0) >= 2, scraper.refusals.refused
        assert hostile_url not in board.loads
        load = board.fresh(honest_url)
        assert load is not None and load.running == 2.0
        warnings = [r for r in caplog.records if hostile_url in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]  # logged once, not per scrape
    finally:
        await scraper.stop()
        hostile.close()
        honest.close()


def test_a_real_vllm_page_is_within_the_bounds() -> None:
    page = REAL_PAGE.read_bytes()
    parse_engine_metrics(page, 0.0)
    sixteen_ranks = page * 16
    assert len(sixteen_ranks) < load_scraper.MAX_PAGE_BYTES
    parse_engine_metrics(sixteen_ranks, 0.0)


def test_the_bounds_refuse_with_what_and_the_bound() -> None:
    with pytest.raises(PageRefused, match=r"200001 lines \(at most 100000\)"):
        parse_engine_metrics(b"x 1\n" * 200_001, 0.0)
