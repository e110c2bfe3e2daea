"""The proxy's upstream HTTP/1.1 client: pooled keep-alive connections per engine, answers parsed by
llhttp (`httptools`), bodies handed over chunk by chunk as they arrive.

It does only what the data path needs — send one request with a known body, read the status and
headers, then the body (content-length, chunked, or until close) — so a request costs a fraction of
a general-purpose client's bookkeeping. Failures surface as `UpstreamError` (a ConnectionError) or
`TimeoutError`; both mean "this engine did not answer", which the proxy retries before the first byte.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from typing import cast
from urllib.parse import urlsplit

import httptools

from corral.router.datapath.deadlines import Deadlines
from corral.router.datapath.transfer_params import AnswerTooLarge

# Past this many unread body bytes the connection stops reading until the proxy catches up.
HIGH_WATER = 1 << 20
LOW_WATER = HIGH_WATER // 4


class UpstreamError(ConnectionError):
    """The engine refused, reset, closed early, or answered something that is not HTTP/1.1."""


class EngineAbandoned(UpstreamError):
    """The router judged the engine failed (its probe timed out, or its supervisor says so) while this
    request was out there: its connection is closed and the request fails now, not at a timeout."""


# Everything that means "this endpoint did not answer": refused, reset, timed out, cut off.
UPSTREAM_FAILURES = (TimeoutError, ConnectionError)  # UpstreamError is a ConnectionError


def describe_failure(exc: BaseException) -> str:
    """One of UPSTREAM_FAILURES in words for a log line or an error answer."""
    if isinstance(exc, TimeoutError):
        return "no answer before --request-timeout"
    if isinstance(exc, EngineAbandoned):
        return f"abandoned: {exc}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class UpstreamResponse:
    """One answer: status and headers once they arrived, then the body as chunks."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_deadlines",
        "_done",
        "_error",
        "_waiter",
        "content_type",
        "headers",
        "status",
    )

    def __init__(self, conn: _Connection, deadlines: Deadlines | None) -> None:
        self._conn = conn
        self._deadlines = deadlines
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.content_type = ""

    # -- fed by the connection ---------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER:
            self._conn.pause()
        self._wake()

    def _finish(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if not self._done and self._error is None:
            self._error = error
            self._wake()

    # -- read by the proxy -------------------------------------------------------------------

    async def _wait(self) -> None:
        waiter = self._waiter = self._conn.loop.create_future()
        deadlines = self._deadlines
        if deadlines is None:
            try:
                await waiter
            finally:
                self._waiter = None
            return
        deadlines.watch(waiter)
        try:
            await waiter
        finally:
            deadlines.done(waiter)
            self._waiter = None

    async def readany(self) -> bytes:
        """The next body bytes as they came (b"" at the end); waits at most the read timeout."""
        while True:
            if self._chunks:
                data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._drain())
                self._buffered -= len(data)
                if self._buffered < LOW_WATER:
                    self._conn.resume()
                return data
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            await self._wait()

    def _drain(self) -> Iterable[bytes]:
        while self._chunks:
            yield self._chunks.popleft()

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body; past `limit` bytes, AnswerTooLarge (the connection is then not reused)."""
        parts = []
        size = 0
        while chunk := await self.readany():
            parts.append(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                raise AnswerTooLarge(limit)
        return b"".join(parts)

    def close(self) -> None:
        """Give the connection back for reuse when the answer ended cleanly, else close it."""
        self._conn.release(reusable=self._done and self._error is None and not self._chunks)


class _Connection(asyncio.Protocol):
    """One TCP connection to an engine, carrying one request at a time.

    It goes back to the pool only when the answer was read to its exact end: a byte the engine
    sends past that end, or while no request is out, belongs to no client, so it closes the
    connection rather than become the next request's answer.
    """

    def __init__(self, pool: _Pool, loop: asyncio.AbstractEventLoop) -> None:
        self._pool = pool
        self.loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._response: UpstreamResponse | None = None
        self._header_list: list[tuple[str, str]] = []
        self._headers_waiter: asyncio.Future[None] | None = None
        self._received = False
        self._paused = False
        self._head = False  # the request was HEAD: the answer has no body whatever it announces
        self._interim = False  # the message being parsed is a 1xx, not the answer
        self._headers_done = False  # the answer's headers arrived; header lines now are trailers
        self._until_close = False  # the answer's body ends when the engine closes the connection
        self._ended = False  # the answer was read to its end
        self.closed = False
        self.idle_since = 0.0
        self.uses = 0

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._received = True
        if self._response is None or self._ended:
            self.close()  # nobody asked for these bytes
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            self.close()  # a message began after the answer ended (on_message_begin)
        except httptools.HttpParserUpgrade:
            self._abort(UpstreamError("the engine switched protocols (101) though no upgrade was asked"))
        except httptools.HttpParserError as exc:
            self._abort(UpstreamError(f"unparseable answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._transport = None
        if self._until_close and exc is None and self._response is not None:
            self._ended = True
            self._response._finish()
            return
        self._fail(UpstreamError(f"connection closed before the answer ended ({exc or 'EOF'})"))

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._ended:
            raise UpstreamError("bytes after the end of the answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._headers_done:  # trailers are not headers: a proxy may drop them (RFC 9110 6.5)
            self._header_list.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        if status < 200:
            # 100 Continue, 102, 103: interim, never the answer (a 101 raises HttpParserUpgrade).
            self._interim = True
            self._header_list = []
            return
        self._headers_done = True
        response = self._response
        if response is None:
            return
        response.status = status
        response.headers = self._header_list
        for name, value in self._header_list:
            if name.lower() == "content-type":
                response.content_type = value.split(";", 1)[0].strip().lower()
                break
        if not parser.should_keep_alive():
            self.closed = True  # Connection: close, HTTP/1.0, or a body delimited by the close
            self._until_close = not self._head and _delimited_by_close(status, self._header_list)
        if self._head:
            self.closed = True  # the parser would read the announced length as a body: never reuse
            self._ended = True
            response._finish()
        waiter = self._headers_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._response is not None and not self._ended:
            self._response._feed(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._ended = True
        response = self._response
        if response is not None:
            response._finish()

    # -- used by the client ------------------------------------------------------------------

    def _fail(self, error: BaseException) -> None:
        waiter = self._headers_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        if self._response is not None:
            self._response._fail(error)

    def _abort(self, error: BaseException) -> None:
        self._fail(error)
        self.close()

    def pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        self._pool.busy.discard(self)
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def abandon(self, error: EngineAbandoned) -> None:
        """Fail the request out on this connection with `error` and close it (the engine is judged
        failed): a wait for the answer's head or its next bytes raises at once."""
        self._abort(error)

    async def send(self, request: bytes, head: bool, deadlines: Deadlines | None) -> UpstreamResponse:
        """Write one request and wait for the answer's status and headers."""
        if self._transport is None or self.closed:
            raise UpstreamError("connection already closed")
        self.uses += 1
        self._received = False
        self._header_list = []
        self._head = head
        response = UpstreamResponse(self, deadlines)
        self._response = response
        self._pool.busy.add(self)  # out until released or closed: what `abandon` reaches
        waiter = self._headers_waiter = self.loop.create_future()
        self._transport.write(request)
        if deadlines is not None:
            deadlines.watch(waiter)
        try:
            await waiter
        finally:
            if deadlines is not None:
                deadlines.done(waiter)
            self._headers_waiter = None
        return response

    @property
    def answered_anything(self) -> bool:
        return self._received

    def release(self, reusable: bool) -> None:
        self._response = None
        self._pool.busy.discard(self)
        self.resume()
        if reusable and self._ended and not self.closed:
            self._parser = httptools.HttpResponseParser(self)
            self._headers_done = self._ended = False
            self._pool.put_back(self)
        else:
            self.close()


def _delimited_by_close(status: int, headers: list[tuple[str, str]]) -> bool:
    """Whether an answer that will not keep the connection has a body that runs to the close."""
    if status in (204, 304):
        return False
    return not any(name.lower() in ("content-length", "transfer-encoding") for name, _ in headers)


class _Pool:
    """Idle keep-alive connections to one engine, newest first; stale ones are dropped on take."""

    def __init__(self, host: str, port: int, keepalive: float) -> None:
        self.host = host
        self.port = port
        self.keepalive = keepalive
        self.idle: deque[_Connection] = deque()
        self.busy: set[_Connection] = set()  # carrying a request now

    def take(self) -> _Connection | None:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive:
                return conn
            conn.close()
        return None

    def put_back(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        self.idle.append(conn)

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


class UpstreamClient:
    """Sends the proxy's requests to engines over pooled HTTP/1.1 keep-alive connections.

    `keepalive` stays below the engines' own idle timeout (uvicorn's is 5 s) so the client, not the
    engine, closes an idle connection; a reused connection that the engine closed anyway before
    answering a byte is retried once on a fresh connection, as no engine saw that request.
    """

    def __init__(
        self, connect_timeout: float | None, read_timeout: float | None, keepalive: float = 4.0
    ) -> None:
        self._connect_timeout = connect_timeout
        # one timer for every wait on an answer (not an asyncio.timeout per wait)
        self._deadlines = Deadlines(read_timeout) if read_timeout else None
        self._keepalive = keepalive
        self._pools: dict[str, _Pool] = {}

    def _pool(self, base_url: str) -> _Pool:
        pool = self._pools.get(base_url)
        if pool is None:
            parts = urlsplit(base_url)
            if parts.scheme != "http" or not parts.hostname:
                raise UpstreamError(f"{base_url}: only http:// engine URLs are supported")
            pool = _Pool(parts.hostname, parts.port or 80, self._keepalive)
            self._pools[base_url] = pool
        return pool

    async def _connect(self, pool: _Pool) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            if self._connect_timeout is None:
                _, conn = await loop.create_connection(lambda: _Connection(pool, loop), pool.host, pool.port)
            else:
                async with asyncio.timeout(self._connect_timeout):
                    _, conn = await loop.create_connection(
                        lambda: _Connection(pool, loop), pool.host, pool.port
                    )
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {pool.host}:{pool.port}: {exc.strerror or exc}") from exc
        return conn

    async def request(
        self, base_url: str, method: str, raw_path: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> UpstreamResponse:
        """Send `method raw_path` with `body` to the engine at `base_url`; returns once the status and
        headers arrived. `headers` must not carry Host, Content-Length or hop-by-hop headers."""
        pool = self._pool(base_url)
        fields = "".join([f"{name}: {value}\r\n" for name, value in headers])
        start = f"{method} {raw_path} HTTP/1.1\r\nHost: {pool.host}:{pool.port}\r\n{fields}"
        request = f"{start}Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body
        head = method == "HEAD"
        conn = pool.take()
        if conn is not None:
            try:
                return await conn.send(request, head, self._deadlines)
            except UpstreamError as exc:
                conn.close()
                if conn.answered_anything or isinstance(exc, EngineAbandoned):
                    raise
                # the engine closed this idle connection as we reused it: it never saw the request
            except BaseException:
                conn.close()
                raise
        conn = await self._connect(pool)
        try:
            return await conn.send(request, head, self._deadlines)
        except BaseException:
            conn.close()
            raise

    def abandon(self, base_url: str, why: str) -> int:
        """Fail every request out to the engine at `base_url` now, closing its connections (the router
        judged that engine failed); how many there were."""
        pool = self._pools.get(base_url)
        if pool is None:
            return 0
        busy = list(pool.busy)
        for conn in busy:
            conn.abandon(EngineAbandoned(why))
        return len(busy)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        if self._deadlines is not None:
            self._deadlines.close()
