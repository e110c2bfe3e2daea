"""The proxy's upstream client against raw TCP servers that misbehave on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from corral.router.datapath.upstream import UpstreamClient, UpstreamError

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
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        writer.close()  # the engine drops the idle keep-alive connection
        await writer.wait_closed()
        closed.set()

    async with raw_server(handler) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=2)
        first = await client.request(url, "POST", "/", [], b"")
        await first.read()
        first.close()
        await asyncio.wait_for(closed.wait(), 10)
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


async def serve_each(
    answers: list[bytes], accepted: list[int] | None = None
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A handler that answers each request it reads, on any connection, with the next of `answers`."""
    queue = list(answers)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if accepted is not None:
            accepted.append(1)
        while queue:
            try:
                await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            writer.write(queue.pop(0))
            await writer.drain()

    return handler


def answer(body: bytes, *extra: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + b"".join(extra) + b"Content-Length: %d\r\n\r\n" % len(body) + body


async def test_an_interim_100_continue_is_skipped_and_never_leaves_the_answer_unread() -> None:
    """The engine's `100 Continue` is not the answer: the 200 behind it is, and the next request on
    the same connection gets its own answer, not the previous one's."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # the real answer comes later, as from a slow engine
        writer.write(answer(b"first", b"X-Interim-Not-Here: 1\r\n"))
        await writer.drain()
        await read_request(reader)
        writer.write(b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
        writer.write(answer(b"second"))
        await writer.drain()

    async with raw_server(handler) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=2)
        first = await client.request(url, "POST", "/", [], b"{}")
        assert (first.status, await first.read()) == (200, b"first")
        assert ("X-Interim-Not-Here", "1") in first.headers
        first.close()
        second = await client.request(url, "POST", "/", [], b"{}")
        assert (second.status, await second.read()) == (200, b"second")
        assert [name for name, _ in second.headers] == ["Content-Length"]  # not the 103's Link
        second.close()
        client.close()


async def test_bytes_after_the_end_of_an_answer_close_the_connection() -> None:
    """An answer followed by more bytes than it announced: the extra bytes are nobody's answer, so the
    connection is closed rather than pooled with them unread."""
    accepted: list[int] = []
    stale = answer(b"stale")
    handler = await serve_each([answer(b"one") + stale, answer(b"two")], accepted)
    async with raw_server(handler) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=2)
        first = await client.request(url, "POST", "/", [], b"")
        assert await first.read() == b"one"
        first.close()
        second = await client.request(url, "POST", "/", [], b"")
        assert await second.read() == b"two"
        second.close()
        client.close()
    assert len(accepted) == 2


async def test_an_idle_connection_that_receives_bytes_is_never_reused() -> None:
    """Bytes from the engine while no request is out (a late answer, say) poison the connection."""
    accepted: list[int] = []
    dropped = asyncio.Event()  # the client closed the connection that got nobody's bytes

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        await read_request(reader)
        writer.write(answer(b"one"))
        await writer.drain()
        if len(accepted) == 1:
            await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")  # headers of nobody's answer
            await writer.drain()
            if not await reader.read(1):
                dropped.set()
                return
            await read_request(reader)  # reused: the client reads the rest of nobody's answer
            writer.write(b"stale" + answer(b"wrong"))
            await writer.drain()

    async with raw_server(handler) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=2)
        first = await client.request(url, "POST", "/", [], b"")
        assert await first.read() == b"one"
        first.close()
        await asyncio.wait_for(dropped.wait(), 10)  # the client saw the bytes and dropped the connection
        second = await client.request(url, "POST", "/", [], b"")
        assert await second.read() == b"one"
        second.close()
        client.close()
    assert len(accepted) == 2


async def test_a_close_delimited_answer_is_read_to_the_close_and_never_pooled() -> None:
    accepted: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil ")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"the close")
        await writer.drain()
        writer.close()

    async with raw_server(handler) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=2)
        for _ in range(2):
            resp = await client.request(url, "POST", "/", [], b"")
            assert await resp.read() == b"until the close"
            resp.close()
        client.close()
    assert len(accepted) == 2


async def test_connection_close_from_the_engine_is_honoured() -> None:
    accepted: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        await read_request(reader)
        writer.write(answer(b"bye", b"Connection: close\r\n"))
        await writer.drain()
        await asyncio.sleep(0.3)  # slower to close than the client is to send the next request
        writer.close()

    async with raw_server(handler) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=2)
        for _ in range(2):
            resp = await client.request(url, "POST", "/", [], b"")
            assert await resp.read() == b"bye"
            resp.close()
        client.close()
    assert len(accepted) == 2


async def test_chunked_trailers_end_the_answer_and_are_not_headers() -> None:
    accepted: list[int] = []
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
        b"3\r\nabc\r\n2\r\nde\r\n0\r\nX-Checksum: 42\r\nSet-Cookie: from-the-trailer\r\n\r\n"
    )
    handler = await serve_each([chunked, answer(b"next")], accepted)
    async with raw_server(handler) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=2)
        resp = await client.request(url, "POST", "/", [], b"")
        assert await resp.read() == b"abcde"
        names = {name.lower() for name, _ in resp.headers}
        assert names == {"transfer-encoding", "trailer"}, resp.headers
        resp.close()
        after = await client.request(url, "POST", "/", [], b"")
        assert await after.read() == b"next"
        after.close()
        client.close()
    assert len(accepted) == 1  # read to its exact end, so pooled and reused


async def test_head_204_and_304_have_no_body_whatever_their_headers_say() -> None:
    accepted: list[int] = []
    handler = await serve_each(
        [
            b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nContent-Type: application/json\r\n\r\n",  # HEAD
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n",
            answer(b"last"),
        ],
        accepted,
    )
    async with raw_server(handler) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=1)
        head = await client.request(url, "HEAD", "/", [], b"")
        assert (head.status, await head.read()) == (200, b"")
        head.close()
        for status in (204, 304, 200):
            resp = await client.request(url, "POST", "/", [], b"")
            assert resp.status == status
            assert await resp.read() == (b"last" if status == 200 else b"")
            resp.close()
        client.close()
    assert len(accepted) <= 2  # a HEAD's connection may be dropped; 204 and 304 keep theirs


async def test_an_unasked_upgrade_and_a_cut_chunked_answer_are_errors() -> None:
    async def upgrade(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")
        await writer.drain()
        writer.close()

    client = UpstreamClient(connect_timeout=2, read_timeout=0.5)
    async with raw_server(upgrade) as url:
        with pytest.raises(UpstreamError):
            await client.request(url, "POST", "/", [], b"")
    async with raw_server(cut) as url:
        resp = await client.request(url, "POST", "/", [], b"")
        with pytest.raises(UpstreamError):
            await resp.read()
        resp.close()
    client.close()
