"""One client connection of the lean server: parsed by llhttp (httptools), the router's inference POSTs
answered here in order, every other request handed to aiohttp's request handler on the same transport.

Requests are answered one after another in the order they arrived (pipelining kept); a request's
body may arrive while an earlier one is answered. The first request that is not an inference POST
(GET /health, /metrics, the dashboard, anything the router answers itself or refuses) hands the rest
of the connection to aiohttp once the answers before it are written: from then on each parsed request
is written again, as HTTP/1.1, into an aiohttp request handler made for this transport, so that the
router's own endpoints keep one implementation. The connection guard
(corral.router.edge.client_connections) sees this protocol as it sees a GuardedConnection: its phase,
last read and request.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol, cast

import httptools

from corral.openai_errors import error_body
from corral.router.datapath.exchange import Answer, Headers
from corral.router.edge.client_connections import ConnectionGuard, Phase, WatchedRequest
from corral.router.edge.parse_errors import ParseErrorLog
from corral.router.serving.request import LeanRequest
from corral.router.serving.wire import (
    CHUNKED_END,
    MAX_LINE,
    DateHeader,
    Malformed,
    check_head,
    check_header,
    head,
)

log = logging.getLogger("corral.router")

KEEP_ALIVE_10 = b"Connection: keep-alive\r\n"
CLOSE = b"Connection: close\r\n"
CHUNKED = b"Transfer-Encoding: chunked\r\n"
PIPELINE_DEPTH = 16  # requests parsed ahead of their answer before the connection stops reading
# Bytes held for later: the heads and bodies of requests parsed ahead of the one being answered, and
# what waits to be handed to aiohttp. Past this the connection stops reading until the answers before
# them are out (it may overshoot by one socket read, 256 KiB with uvloop). Sixteen ordinary chat
# requests fit; one larger body ahead waits in the client's socket, not in the router. The request
# being answered is not counted: its body (up to --max-body-size) is complete before any byte ahead.
HELD_AHEAD = 1024 * 1024
# Given to aiohttp in place of a request the lean server refused after the hand-off: aiohttp refuses it
# (400, close) after the answers it owes, as it refuses a malformed request of its own
REFUSED_FOR_AIOHTTP = b"\x00 malformed request refused by the router\r\n\r\n"


class ConnectionHost(Protocol):
    """What a connection needs of the server that accepted it (`server.LeanServer`): its connection
    guard and table, its clock and Date header, which requests it answers itself and how, and the
    hand-off of the others to aiohttp."""

    guard: ConnectionGuard | None
    handoff: Callable[[], asyncio.Protocol]
    parse_log: ParseErrorLog
    max_body: int
    date: DateHeader
    connections: set[LeanConnection]

    def now(self) -> float: ...

    def serves(self, target: str) -> bool: ...

    async def answer(self, conn: LeanConnection, request: LeanRequest) -> bool: ...


class LeanConnection(asyncio.Protocol):
    def __init__(self, server: ConnectionHost) -> None:
        self._server = server
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        # what the connection guard reads and sets
        self.phase = Phase.HEADER
        self.since = self.last_read = 0.0
        self.request: WatchedRequest | None = None
        self.stalled_at: float | None = None
        self.header_bytes = 0
        self._queue: deque[LeanRequest] = deque()
        self._task: asyncio.Task[None] | None = None
        self._parsing: LeanRequest | None = None
        self._url = b""
        self._headers: Headers = []
        self._seen: set[str] = set()
        self._refusal: bytes | None = None  # a malformed request's 400, written after earlier answers
        self._malformed: LeanRequest | None = None  # the queued request whose body was malformed
        self._write_paused = False
        self._corked: list[bytes] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._read_paused = False
        # handing off to aiohttp: the bytes written for it, its handler once earlier answers are out
        self._handoff: bytearray | None = None
        self._inner: asyncio.Protocol | None = None
        self._rechunk = False
        self._in_head = False  # between a request's first byte and its headers' end (after: trailers)
        self._raw = False  # after an Upgrade/CONNECT head: every byte is aiohttp's, unparsed here
        self._upgrade_head = b""
        self._closing = False  # the handed-off request being parsed ends the connection
        self._ended = False  # a request that ends the connection was read: nothing after it is parsed

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        server = self._server
        if server.guard is not None and not server.guard.admit(self, transport):
            return
        self.transport = transport
        self.since = self.last_read = server.now()
        server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self._refusal is not None or self._ended:
            return  # after a request that ends the connection, the rest is never parsed (as aiohttp)
        self.last_read = now = self._server.now()
        if self.phase is Phase.IDLE:
            self.phase, self.since, self.header_bytes = Phase.HEADER, now, 0
        if self.phase is Phase.HEADER:
            self.header_bytes += len(data)
        if self._raw:
            self._to_inner(data)
            self._hold_back()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            if self._ended:  # CONNECT: its head alone goes to aiohttp (400, close); the rest is dropped
                self._to_inner(self._upgrade_head)
                return
            # llhttp skips an Upgrade/CONNECT request's body and would parse the bytes after the head
            # as new requests: the head went to aiohttp (on_headers_complete), and so does every byte
            # after it, unparsed here, so that aiohttp reads them as that request's body, as it would
            # have alone (issue 27: a request hidden in the body was served)
            self._raw = True
            self._to_inner(self._upgrade_head + data[upgrade.args[0] :])
        except (httptools.HttpParserError, Malformed) as exc:
            if not self._ended:  # else bytes after a request that ends the connection: never parsed
                self._refuse(exc)
        if self._task is not None and (len(self._queue) > 1 or self._handoff):
            self._hold_back()

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            return self._inner.eof_received()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return
        if self._server.guard is not None:
            self._server.guard.forget(self)
        self.transport = None
        self._server.connections.discard(self)
        if self._task is not None:
            self._task.cancel()  # the client hung up: its upstream request is cancelled
        if self._parsing is not None:
            self._parsing.set_exception(ConnectionResetError("the client closed the connection"))
        self._wake_writer()
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()
        if self._inner is not None:
            self._inner.resume_writing()

    # -- httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._seen = set()
        self._in_head = True

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_LINE:
            raise Malformed(f"Got more than {MAX_LINE} bytes when reading the request target")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:
            self._headers.append(check_header(name, value, self._seen, len(self._headers)))
        # else a chunked body's trailer: dropped, as aiohttp drops them (never a request header)

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        version = parser.get_http_version()
        check_head(version, self._headers, self._seen)
        method = parser.get_method().decode("ascii")
        target = self._url.decode("latin-1")
        server = self._server
        upgrade = parser.should_upgrade()  # Connection: upgrade + Upgrade, or CONNECT: aiohttp's
        if self._handoff is None and method == "POST" and not upgrade and server.serves(target):
            path = target.partition("?")[0]
            request = LeanRequest(
                method, target, path, self._headers, version, parser.should_keep_alive(), server.max_body
            )
            if "content-length" in self._seen:
                request.declared = int(next(v for k, v in self._headers if k.lower() == "content-length"))
            self._parsing = request
            if self._queue:  # parsed ahead of an answer: its head is held too
                request.held = len(self._url) + sum(len(k) + len(v) + 4 for k, v in self._headers)
            self._queue.append(request)
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._serve())
            elif len(self._queue) > PIPELINE_DEPTH and self.transport is not None and not self._read_paused:
                self._read_paused = True
                self.transport.pause_reading()
            return
        # aiohttp's from here on: the head written again as it came (after an Upgrade/CONNECT head,
        # the rest of the connection as it came: data_received)
        self._rechunk = "transfer-encoding" in self._seen and not upgrade
        self._closing = not upgrade and not parser.should_keep_alive()
        lines = [
            f"{method} {target} HTTP/{version}\r\n",
            *[f"{k}: {v}\r\n" for k, v in self._headers],
            "\r\n",
        ]
        written = "".join(lines).encode("latin-1")
        if upgrade:  # given to aiohttp with the bytes after it, in one read, as aiohttp alone reads them
            self._upgrade_head = written
            # ... but never after a CONNECT: llhttp reads what follows as a tunnel, aiohttp parses it
            # as new requests once the tunnel is declined (a request hidden in the body was served);
            # corral.router.edge.refused_framing answers it 400 and closes, and nothing after it is parsed
            self._ended = method == "CONNECT"
        else:
            self._to_inner(written)

    def on_body(self, body: bytes) -> None:
        if self._parsing is not None:
            self._parsing.feed(body)
        elif self._rechunk:
            self._to_inner(b"%x\r\n%s\r\n" % (len(body), body))
        else:
            self._to_inner(body)

    def on_message_complete(self) -> None:
        request = self._parsing
        if request is not None:
            request.finish()
            self._parsing = None
            if not request.keep_alive:
                self._ended = True
            return
        if self._rechunk:
            self._to_inner(CHUNKED_END)
        if self._closing:
            self._ended = True

    # -- answering -------------------------------------------------------------------------------

    async def _serve(self) -> None:
        queue = self._queue
        keep_alive = True
        answered: LeanRequest | None = None
        try:
            while queue and self.transport is not None and keep_alive:
                answered = queue[0]
                keep_alive = await self._server.answer(self, answered)
                queue.popleft()
                if self._read_paused and len(queue) <= PIPELINE_DEPTH // 2 and self.transport is not None:
                    if self._held() <= HELD_AHEAD // 2:
                        self._read_paused = False
                        self.transport.resume_reading()
        finally:
            self._task = None
        if self.transport is None:
            return
        if self._refusal is not None and (keep_alive or answered is self._malformed):
            self.write(self._refusal)
            self._close()
        elif not keep_alive:
            self._close()  # a refusal of what came after this answer is never written (as aiohttp)
        elif self._handoff is not None:
            self._start_inner()

    def _held(self) -> int:
        """Bytes held for later: requests parsed ahead of the one being answered, and the hand-off's."""
        queue = self._queue
        held = len(self._handoff) if self._handoff else 0
        for i in range(1, len(queue)):
            request = queue[i]
            held += request.held + request.size
        return held

    def _hold_back(self) -> None:
        """Stop reading while more than HELD_AHEAD bytes wait behind the request being answered."""
        transport = self.transport
        if not self._read_paused and transport is not None and self._task is not None:
            if self._held() > HELD_AHEAD:
                self._read_paused = True
                transport.pause_reading()

    def write(self, data: bytes, cork: bool = False) -> None:
        """Send `data` now, or with `cork` at the end of this turn of the event loop, together with
        whatever else is written until then (a stream's head and first chunk, its last chunk and its
        end): fewer, fuller segments for both ends."""
        transport = self.transport
        if transport is None:
            return
        if self._corked is not None:
            self._corked.append(data)
        elif cork:
            self._corked = [data]
            asyncio.get_running_loop().call_soon(self._uncork)
        else:
            transport.write(data)

    def _uncork(self) -> None:
        corked, self._corked = self._corked, None
        if corked and self.transport is not None:
            self.transport.write(b"".join(corked))

    async def drain(self) -> None:
        """Wait while the client reads slower than the router writes (the transport's buffer is over
        its high-water mark): an engine's stream is never buffered without bound for a slow client."""
        while self._write_paused and self.transport is not None:
            self._drained = asyncio.get_running_loop().create_future()
            try:
                await self._drained
            finally:
                self._drained = None

    def _wake_writer(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def idle(self) -> bool:
        """Nothing being answered and no request begun."""
        return self._task is None and (self.phase is Phase.IDLE or self.header_bytes == 0)

    @property
    def handed_off(self) -> bool:
        return self._inner is not None

    def close(self) -> None:
        self._close()

    def _close(self) -> None:
        if self.transport is not None:
            self._uncork()
            self.transport.close()

    def _refuse(self, exc: Exception) -> None:
        """A malformed request: 400 in OpenAI's shape once the answers before it are out, then close."""
        if isinstance(exc, httptools.HttpParserCallbackError) and isinstance(exc.__context__, Malformed):
            exc = exc.__context__  # one of the checks aiohttp makes beyond llhttp's (serving.wire)
        what = str(exc) or type(exc).__name__
        transport = self.transport
        if transport is None:
            return
        more = self._server.parse_log.note()
        if more is not None:
            peer = transport.get_extra_info("peername")
            log.warning(
                "refused a malformed request from %s with %d: %s%s",
                peer[0] if peer else "a client",
                400,
                what.split(":", 1)[0].strip(),
                more,
            )
        if self._parsing is not None:
            self._malformed = self._parsing  # its answer is this refusal
            self._parsing.set_exception(ConnectionResetError("malformed request"))
        if self._handoff is not None:
            # aiohttp has the connection's earlier requests and writes their answers: it is given a
            # request it refuses (400, close) in this one's place, so that the refusal comes after them
            self._to_inner(REFUSED_FOR_AIOHTTP)
            self._ended = True
            return
        body = error_body(f"The request is malformed: {what}.", "BadRequestError", 400)
        self._refusal = (
            head(
                400,
                [("Content-Type", "application/json")],
                b"Content-Length: %d\r\n" % len(body),
                CLOSE,
                self._server.date.line(),
                version="1.0",  # the request's own version is not known: the oldest, as aiohttp answers
            )
            + body
        )
        if self._task is None:
            self.write(self._refusal)
            self._close()

    # -- handing off to aiohttp -----------------------------------------------------------------

    def _to_inner(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
            return
        if self._handoff is None:
            self._handoff = bytearray()
        self._handoff += data
        if self._task is None:
            self._start_inner()

    def _start_inner(self) -> None:
        transport = self.transport
        if self._inner is not None or transport is None:
            return
        self._uncork()  # the last answer's end goes out before aiohttp writes anything
        inner = self._inner = self._server.handoff()
        inner.connection_made(transport)
        if self._write_paused:
            inner.pause_writing()
        pending, self._handoff = bytes(self._handoff or b""), bytearray()
        if self._read_paused:  # before aiohttp reads: its own flow control may pause again
            self._read_paused = False
            transport.resume_reading()
        if pending:
            inner.data_received(pending)


class LeanReply:
    """The answer to one LeanRequest (corral.router.datapath.exchange's ClientReply)."""

    __slots__ = ("_chunked", "_conn", "_keep_alive", "_request", "started")

    def __init__(self, conn: LeanConnection, request: LeanRequest) -> None:
        self._conn = conn
        self._request = request
        self._keep_alive = request.keep_alive
        self._chunked = False
        self.started = False

    @property
    def keep_alive(self) -> bool:
        return self._keep_alive

    def close_after(self) -> None:
        self._keep_alive = False

    def _connection(self) -> bytes:
        if not self._keep_alive:
            return CLOSE
        return KEEP_ALIVE_10 if self._request.version == "1.0" else b""

    async def send(self, answer: Answer) -> None:
        self.started = True
        conn = self._conn
        body = answer.body
        framing = b"Content-Length: %d\r\n" % len(body)
        conn.write(
            head(answer.status, answer.headers, framing, self._connection(), conn._server.date.line()) + body
        )

    async def start(self, status: int, headers: Headers) -> None:
        self.started = True
        conn = self._conn
        if self._request.version == "1.1":
            self._chunked = True
            framing = CHUNKED
        else:
            self._keep_alive, framing = False, b""  # HTTP/1.0: the end of the answer is the close
        conn.write(head(status, headers, framing, self._connection(), conn._server.date.line()), cork=True)

    async def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        conn = self._conn
        conn.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if self._chunked else chunk, cork=True)
        if conn._write_paused:
            await conn.drain()

    async def finish(self) -> None:
        if self._chunked:
            self._conn.write(CHUNKED_END, cork=True)
