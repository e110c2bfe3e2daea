"""The lean GET the router scrapes engines' /metrics with: a kept-alive connection reused while the
engine keeps it, a reused connection the engine closed retried on a fresh one, bodies by length, by
chunks and by close, and a clear error for an answer too large, an engine that never answers, a URL
it cannot use."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from corral.engine.page_get import PageClient, PageError
from tests.support.procs import free_port

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


async def _serve(answer: Answer) -> tuple[asyncio.Server, str, list[int]]:
    """A raw HTTP server: `answer(reader, writer, n)` answers the connection's n-th request and says
    whether to keep the connection. Returns the server, its url and requests per connection."""
    per_connection: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        per_connection.append(0)
        k = len(per_connection) - 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"GET /")
                per_connection[k] += 1
                if not await answer(reader, writer, per_connection[k]):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", per_connection


@pytest.fixture
async def client() -> AsyncIterator[PageClient]:
    page_client = PageClient(timeout=2.0)
    yield page_client
    page_client.close()


async def _length(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
    body = b"page %d" % n
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    return True


async def test_a_kept_alive_connection_serves_the_next_get(client: PageClient) -> None:
    server, url, per_connection = await _serve(_length)
    async with server:
        assert await client.get(url, "/metrics") == (200, b"page 1")
        assert client.idle == 1
        assert await client.get(url, "/metrics") == (200, b"page 2")
        assert per_connection == [2]


async def test_without_keepalive_each_get_has_its_own_connection() -> None:
    server, url, per_connection = await _serve(_length)
    page_client = PageClient(timeout=2.0, keepalive=0.0)
    try:
        async with server:
            assert await page_client.get(url, "/metrics") == (200, b"page 1")
            assert page_client.idle == 0
            assert await page_client.get(url, "/metrics") == (200, b"page 1")
            assert per_connection == [1, 1]
    finally:
        page_client.close()


async def test_a_reused_connection_the_engine_dropped_is_retried_on_a_fresh_one(client: PageClient) -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        if n > 1:
            return False  # closes without answering, as an engine's idle timeout does mid-reuse
        return await _length(reader, writer, n)

    server, url, per_connection = await _serve(once)
    async with server:
        assert await client.get(url, "/metrics") == (200, b"page 1")
        assert await client.get(url, "/metrics") == (200, b"page 1")
        assert per_connection == [2, 1]


async def test_chunked_and_close_delimited_bodies(client: PageClient) -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nvllm:\r\n3\r\nabc\r\n0\r\n\r\n"
        )
        await writer.drain()
        return True

    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nthe whole page")
        await writer.drain()
        return False

    first, chunked_url, _ = await _serve(chunked)
    second, close_url, _ = await _serve(until_close)
    async with first, second:
        assert await client.get(chunked_url, "/metrics") == (200, b"vllm:abc")
        assert await client.get(close_url, "/metrics") == (200, b"the whole page")
        assert await client.get(close_url + "/", "/metrics") == (200, b"the whole page")


async def test_a_path_in_the_base_url_prefixes_the_page() -> None:
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append((await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")[0])
        await _length(reader, writer, 1)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    page_client = PageClient(timeout=2.0)
    try:
        async with server:
            assert await page_client.get(f"http://127.0.0.1:{port}/e7", "/metrics") == (200, b"page 1")
    finally:
        page_client.close()
    assert seen == [b"GET /e7/metrics HTTP/1.1"]


async def test_headers_are_sent_and_a_line_break_in_one_is_refused() -> None:
    heads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        await _length(reader, writer, 1)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    page_client = PageClient(timeout=2.0)
    try:
        async with server:
            await page_client.get(url, "/v1/models", {"Authorization": "Bearer engine-key"})
            with pytest.raises(PageError, match="'Authorization' holds a line break") as refused:
                await page_client.get(url, "/v1/models", {"Authorization": "Bearer a\r\nX-Evil: 1"})
    finally:
        page_client.close()
    assert b"\r\nAuthorization: Bearer engine-key\r\n" in heads[0]
    assert "Bearer" not in str(refused.value)  # a key is never echoed


async def test_an_idle_connection_is_closed_after_keepalive() -> None:
    server, url, _ = await _serve(_length)
    page_client = PageClient(timeout=2.0, keepalive=0.05)
    try:
        async with server:
            await page_client.get(url, "/metrics")
            assert page_client.idle == 1
            for _ in range(100):
                if page_client.idle == 0:
                    break
                await asyncio.sleep(0.02)
            assert page_client.idle == 0
    finally:
        page_client.close()


async def test_too_large_silent_and_unusable_answers_are_errors() -> None:
    async def large(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n\r\n" + b"x" * 4096)
        await writer.drain()
        return True

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        await asyncio.sleep(5)
        return False

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        return True

    small = PageClient(timeout=0.3, max_bytes=1024)
    try:
        first, large_url, _ = await _serve(large)
        second, silent_url, _ = await _serve(silent)
        third, garbage_url, _ = await _serve(garbage)
        async with first, second, third:
            with pytest.raises(PageError, match="larger than 1024 bytes"):
                await small.get(large_url, "/metrics")
            with pytest.raises(TimeoutError):
                await small.get(silent_url, "/metrics")
            with pytest.raises(PageError, match="unparseable"):
                await small.get(garbage_url, "/metrics")
            with pytest.raises(PageError, match="only http://"):
                await small.get("https://127.0.0.1:1", "/metrics")
            with pytest.raises(PageError, match="cannot connect"):
                await small.get(f"http://127.0.0.1:{free_port()}", "/metrics")  # nobody listens
            assert small.idle == 0
    finally:
        small.close()
