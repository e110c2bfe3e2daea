"""The router's lean server side (`corral router --http-server lean`) on the wire, whatever the default.

The lean server answers the inference POSTs itself and hands the rest of a connection to aiohttp at
the first request that is not one; these tests pin what that must not break: answers in the order
the requests came across the handoff, a client that hangs up cancelling its engine request, and a
client that reads slowly holding the engine back instead of filling the router's memory. The rest of
the router's suite runs against either server (CORRAL_ROUTER_HTTP_SERVER=lean).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import psutil
import pytest

from tests.support import nonce_engine
from tests.support.nonce_engine import MODEL
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Lean:
    url: str
    host: str
    port: int
    proc: CorralProcess
    engine_url: str


@pytest.fixture(scope="module")
def lean() -> Iterator[Lean]:
    engine, engine_url = nonce_engine.start(ROOT)
    port = free_port()
    proc = CorralProcess(
        [
            "router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend",
            engine_url,
            "--http-server",
            "lean",
        ]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(url + "/health")
        yield Lean(url, "127.0.0.1", port, proc, engine_url)
    finally:
        proc.stop()
        nonce_engine.stop(engine)


def post(nonce: str, extra: bytes = b"") -> bytes:
    body = orjson.dumps({"model": MODEL, "prompt": "hi", "nonce": nonce})
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-nonce: %s\r\n%s"
        b"Content-Length: %d\r\n\r\n%s" % (nonce.encode(), extra, len(body), body)
    )


def get(path: str) -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path.encode()  # admin routes want a loopback Host


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One whole answer (content-length or chunked), interim 1xx answers skipped."""
    while True:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {
            k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if line)
        }
        if status >= 200:
            break
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    await reader.readexactly(2)
    return status, headers, body


async def test_pipelined_requests_are_answered_in_order_across_the_handoff(lean: Lean) -> None:
    """Inference POSTs (the lean server's) and GETs (aiohttp's) on one connection, all sent at once,
    the first one slow: every answer comes back in the order asked, each to its own request."""
    reader, writer = await asyncio.open_connection(lean.host, lean.port)
    writer.write(post("a", b"x-delay-ms: 300\r\n") + get("/health") + post("b") + get("/livez") + post("c"))
    await writer.drain()
    answers = [await read_answer(reader) for _ in range(5)]
    writer.close()
    assert [status for status, _, _ in answers] == [200] * 5, answers
    assert [h.get("x-nonce") for _, h, _ in answers] == ["a", None, "b", None, "c"]
    assert orjson.loads(answers[1][2])["status"] == "ok"
    assert orjson.loads(answers[3][2]) == {"status": "alive"}


async def test_the_lean_server_answers_malformed_bytes_in_the_openai_shape(lean: Lean) -> None:
    reader, writer = await asyncio.open_connection(lean.host, lean.port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\nContent-Length: 2\r\n\r\n{}")
    status, headers, body = await read_answer(reader)
    assert status == 400 and headers["connection"] == "close"
    assert orjson.loads(body)["error"]["code"] == 400
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed
    writer.close()


async def requests_counted(lean: Lean, code: str) -> float:
    reader, writer = await asyncio.open_connection(lean.host, lean.port)
    writer.write(get("/metrics"))
    _, _, page = await read_answer(reader)
    writer.close()
    total = 0.0
    for line in page.decode().splitlines():
        if line.startswith("corral_router_requests_total{") and f'code="{code}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def engine_saw(lean: Lean, nonce: str) -> bool:
    with urllib.request.urlopen(lean.engine_url + "/_seen", timeout=5) as resp:
        return any(s.get("nonce") == nonce for s in orjson.loads(resp.read()))


async def test_a_client_that_hangs_up_cancels_its_engine_request(lean: Lean) -> None:
    """The engine would answer after 60 s; the client leaves once the engine has its request. The
    request is counted as the client's (499) at once, not as the engine's 200 when it comes."""
    before = await requests_counted(lean, "499")
    nonce = f"gone-{time.monotonic_ns()}"
    _, writer = await asyncio.open_connection(lean.host, lean.port)
    writer.write(post(nonce, b"x-delay-ms: 60000\r\n"))
    await writer.drain()
    await asyncio.to_thread(wait_until, lambda: engine_saw(lean, nonce), 30, "the engine got the request")
    writer.close()
    deadline = time.monotonic() + 30.0  # the engine's answer is due at 60 s
    while await requests_counted(lean, "499") == before:
        assert time.monotonic() < deadline, "the router kept waiting for the engine after the client left"
        await asyncio.sleep(0.1)


async def test_a_slow_client_holds_the_engine_back_instead_of_filling_the_router(lean: Lean) -> None:
    """A 48 MB streamed answer to a client that stops reading: the router's memory grows by a few
    socket buffers, not by the answer; once the client reads again it gets every byte."""
    size = 48 * 1024 * 1024
    router = psutil.Process(lean.proc.pid)
    rss_before = router.memory_info().rss
    reader, writer = await asyncio.open_connection(lean.host, lean.port, limit=1 << 16)
    writer.write(post("slow", b"x-framing: sse\r\nx-answer-bytes: %d\r\n" % size))
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
    assert b" 200 " in head.split(b"\r\n", 1)[0]
    await asyncio.sleep(2.0)  # not reading: the engine's stream backs up
    grown = router.memory_info().rss - rss_before
    received = 0
    while True:
        line = await asyncio.wait_for(reader.readuntil(b"\r\n"), 20)
        chunk = int(line.strip(), 16)
        if not chunk:
            break
        received += len(await reader.readexactly(chunk))
        await reader.readexactly(2)
    writer.close()
    assert grown < size // 4, f"the router grew by {grown} bytes while its client did not read"
    assert received > size
