"""The proxy's upstream client against raw TCP servers that misbehave on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from corral.router.upstream import UpstreamClient, UpstreamError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


async def test_keeps_the_connection_alive_and_sends_the_body() -> None:
    seen: list[bytes] = []
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        for _ in range(3):
            seen.append(await read_request(reader))
            writer.write(OK)
            await writer.drain()

    async with raw_server(handler) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=2)
        for _ in range(3):
            resp = await client.request(url, "POST", "/v1/x?a=1", [("X-Request-Id", "r1")], b'{"k": 1}')
            assert (resp.status, resp.content_type, await resp.read()) == (200, "application/json", b"{}")
            resp.close()
        client.close()
    assert connections == 1
    assert seen[0].startswith(b"POST /v1/x?a=1 HTTP/1.1\r\n")
    assert b"X-Request-Id: r1\r\n" in seen[0] and seen[0].endswith(b'\r\n\r\n{"k": 1}')


async def test_chunked_body_arrives_in_pieces() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for part in (b"data: 1\n\n", b"data: [DONE]\n\n"):
            writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with raw_server(handler) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=2)
        resp = await client.request(url, "POST", "/", [], b"")
        assert resp.content_type == "text/event-stream"
        assert await resp.readany() == b"data: 1\n\n"
        assert await resp.readany() == b"data: [DONE]\n\n"
        assert await resp.readany() == b""
        resp.close()
        client.close()


async def test_a_reused_connection_the_engine_closed_is_retried_on_a_fresh_one() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        writer.close()  # the engine drops the idle keep-alive connection

    async with raw_server(handler) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=2)
        first = await client.request(url, "POST", "/", [], b"")
        await first.read()
        first.close()
        await asyncio.sleep(0.05)
        second = await client.request(url, "POST", "/", [], b"")
        assert await second.read() == b"{}"
        second.close()
        client.close()


async def test_cut_mid_body_refused_garbage_and_silence_are_errors() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    client = UpstreamClient(connect_timeout=2, read_timeout=0.3)
    async with raw_server(cut) as url:
        resp = await client.request(url, "POST", "/", [], b"")
        with pytest.raises(UpstreamError):
            await resp.read()
        resp.close()
    async with raw_server(garbage) as url:
        with pytest.raises(UpstreamError):
            await client.request(url, "POST", "/", [], b"")
    async with raw_server(silent) as url:
        with pytest.raises(TimeoutError):
            await client.request(url, "POST", "/", [], b"")
    with pytest.raises(UpstreamError):
        await client.request(url, "POST", "/", [], b"")  # that server is gone now: refused
    client.close()
