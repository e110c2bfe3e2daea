"""benchmarks/stream_timing.py, the per-token clock of bench_pd: TTFT at the first event with text (not the
role-only first event), one ITL gap per later text event even when events arrive split across chunks or
several to a chunk, completion tokens from the usage event, and a stream without [DONE] or with an error
event counted as failed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from stream_timing import TimedReport, stream_timed

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3}}\n\n'


def text(t: str) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"' + t.encode() + b'"}}]}\n\n'


async def serve(writes: list[bytes]) -> TestServer:
    """An SSE endpoint writing `writes` as separate chunks, 20 ms apart."""

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in writes:
            await resp.write(chunk)
            await asyncio.sleep(0.02)
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


async def timed(writes: list[bytes]) -> TimedReport:
    server = await serve(writes)
    try:
        async with aiohttp.ClientSession() as session:
            url = str(server.make_url("/v1/chat/completions"))
            sample = await stream_timed(session, url, b"{}", aiohttp.ClientTimeout(total=10))
    finally:
        await server.close()
    return TimedReport("t", [sample], wall=1.0)


async def test_gaps_count_text_events_across_split_and_joined_chunks() -> None:
    second = text("b")
    report = await timed([ROLE, text("a"), second[:10], second[10:] + text("c") + USAGE, b"data: [DONE]\n\n"])
    [sample] = report.ok
    assert sample.ttft is not None and sample.ttft < sample.latency
    # a, then b (split over two writes) completed in the same read as c: two gaps, the second zero.
    assert len(sample.gaps) == 2
    assert sample.gaps[1] == 0.0
    assert sample.completion_tokens == 3
    assert report.summary()["out_tok_s"] == 3.0


async def test_role_only_event_is_not_the_first_token() -> None:
    report = await timed([ROLE, ROLE, text("a"), text("b"), b"data: [DONE]\n\n"])
    [sample] = report.ok
    assert sample.ttft is not None
    assert len(sample.gaps) == 1  # a to b; the role events open no gap


async def test_missing_done_and_error_event_fail() -> None:
    cut = await timed([ROLE, text("a")])
    assert cut.failures() == {"stream ended without [DONE]": 1}
    errored = await timed([text("a"), b'data: {"error":{"message":"boom"}}\n\n', b"data: [DONE]\n\n"])
    assert errored.failures() == {"error event in stream": 1}
