"""A lean GET of an engine's own pages (the router's `/metrics` scrapes): HTTP/1.1, one kept-alive
connection per engine while the engine keeps it, the answer parsed by llhttp (`httptools`) and collected
whole up to a size cap.

A general-purpose client spends most of a scrape on its own bookkeeping (`benchmarks/bench_page_get.py`,
a real 54 KB vLLM page: aiohttp 0.38–0.40 ms of CPU per GET on a new connection and 0.13 ms on a kept-alive
one; this 0.11 ms and 0.07 ms), and a router that scrapes a thousand engines pays it fifty times a second
on the core that serves requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

# An engine's /metrics is ~50 KB (one adapter or rank more adds lines, not megabytes).
MAX_PAGE_BYTES = 8 << 20
# Below uvicorn's idle timeout (5 s), so that this client, not the engine, drops an idle connection.
KEEPALIVE_SECONDS = 4.0


class PageError(ConnectionError):
    """The engine refused, reset, closed early, or answered something that is not HTTP/1.1."""


class PageTooLarge(PageError):
    """The answer's body ran past the client's size cap; the rest was not read."""


class _PageConnection(asyncio.Protocol):
    """One connection, one GET at a time; the answer's status and whole body."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: asyncio.Future[tuple[int, bytes]] | None = None
        self.parts: list[bytes] = []
        self.size = 0
        self.received = False
        self.reusable = False
        self.until_close = False  # no length and no chunks: the body ends when the engine closes
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.received = True
        if self.answer is None or self.answer.done():
            self.close()  # bytes nobody asked for: never the next GET's answer
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(PageError(f"unparseable answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.until_close and exc is None and self.answer is not None and not self.answer.done():
            self.answer.set_result((self.parser.get_status_code(), b"".join(self.parts)))
            return
        self.fail(PageError(f"connection closed before the answer ended ({exc or 'EOF'})"))

    def on_headers_complete(self) -> None:
        self.until_close = not self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.max_bytes:
            self.fail(PageTooLarge(f"answer larger than {self.max_bytes} bytes"))
            return
        self.parts.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            return  # an interim answer (100, 103): the real one follows
        self.reusable = self.parser.should_keep_alive()
        if self.answer is not None and not self.answer.done():
            self.answer.set_result((status, b"".join(self.parts)))

    def fail(self, error: BaseException) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(error)
        self.close()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def send(self, request: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future[tuple[int, bytes]]:
        if self.transport is None:
            raise PageError("connection already closed")
        self.parser = httptools.HttpResponseParser(self)
        self.parts, self.size, self.received = [], 0, False
        self.reusable = self.until_close = False
        self.answer = loop.create_future()
        self.transport.write(request)
        return self.answer


def _request(target: str, host: str, headers: Mapping[str, str]) -> bytes:
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        if "\r" in name + value or "\n" in name + value:
            # the value is not quoted: it may be an API key
            raise PageError(f"header {name.strip()!r} holds a line break; give it on one line")
        lines.append(f"{name}: {value}")
    try:
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError:
        raise PageError(
            "a header holds characters outside Latin-1; HTTP/1.1 headers cannot carry them"
        ) from None


class PageClient:
    """GETs of small pages from many engines; `timeout` bounds each GET, connecting included. A
    connection is kept `keepalive` seconds for the engine's next GET (0: closed once answered, for
    callers that ask each engine less often than that)."""

    def __init__(
        self, timeout: float, keepalive: float = KEEPALIVE_SECONDS, max_bytes: int = MAX_PAGE_BYTES
    ) -> None:
        self.timeout = timeout
        self.keepalive = keepalive
        self.max_bytes = max_bytes
        self._idle: dict[str, _PageConnection] = {}  # base url -> its idle connection

    async def get(
        self, base_url: str, path: str, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of `GET base_url + path` with `headers` (an engine API key). Raises PageError
        (a ConnectionError) or TimeoutError."""
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise PageError(f"{base_url}: only http:// engine URLs are supported")
        host, port = parts.hostname, parts.port or 80
        request = _request(f"{parts.path.rstrip('/')}{path}", f"{host}:{port}", headers or {})
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.timeout):
            conn = self._take(base_url)
            if conn is not None:
                try:
                    return await self._exchange(base_url, conn, request, loop)
                except PageError:
                    if conn.received:
                        raise
                    # the engine closed the idle connection as it was reused: it never saw the GET
            try:
                _, conn = await loop.create_connection(lambda: _PageConnection(self.max_bytes), host, port)
            except OSError as exc:
                raise PageError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
            return await self._exchange(base_url, conn, request, loop)

    async def _exchange(
        self, base_url: str, conn: _PageConnection, request: bytes, loop: asyncio.AbstractEventLoop
    ) -> tuple[int, bytes]:
        try:
            answer = await conn.send(request, loop)
        except BaseException:
            conn.close()
            raise
        if conn.reusable and conn.transport is not None and self.keepalive > 0:
            conn.answer = None
            conn.idle_since = time.monotonic()
            old = self._idle.pop(base_url, None)
            if old is not None:
                old.close()
            self._idle[base_url] = conn
            loop.call_later(self.keepalive, self._expire, base_url, conn)
        else:
            conn.close()
        return answer

    def _expire(self, base_url: str, conn: _PageConnection) -> None:
        """An idle connection past `keepalive` is closed, not kept open until the engine's next turn."""
        if self._idle.get(base_url) is conn and time.monotonic() - conn.idle_since >= 0.99 * self.keepalive:
            del self._idle[base_url]
            conn.close()

    def _take(self, base_url: str) -> _PageConnection | None:
        conn = self._idle.pop(base_url, None)
        if conn is None:
            return None
        if conn.transport is None or time.monotonic() - conn.idle_since >= self.keepalive:
            conn.close()
            return None
        return conn

    @property
    def idle(self) -> int:
        """Connections kept open for the next GET."""
        return len(self._idle)

    def close(self) -> None:
        for conn in self._idle.values():
            conn.close()
        self._idle.clear()
