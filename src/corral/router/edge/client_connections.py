"""Each client connection's phase and how long it may last: a request header must arrive within
--header-timeout, a body may not stall longer than --body-timeout, a connection idle between
requests is closed after --idle-timeout, and at most --max-connections are open at once.

aiohttp has no header-read timeout, and its keep-alive timer also lets half a header sit for as long
as an idle connection. So the router listens itself: every connection's protocol is our thin
`GuardedConnection`, which passes the five asyncio.Protocol callbacks through to the aiohttp
request handler made by `AppRunner.server` (the factory TCPSite would hand to loop.create_server)
and notes when bytes arrive. The app's middleware tells us when a request reaches it and when it
leaves; a sweep a few times per shortest timeout closes what overstayed. The lean server
(corral.router.serving, `--http-server lean`) keeps the same fields on its own connections and tells
the guard itself (`WatchedConnection`). What this leans on in
aiohttp, each pinned by tests/integration/test_router_client_limits.py:
- `runner.server()` makes one asyncio.Protocol per connection, and the handler uses only the
  transport it is given (`request.transport` is that transport);
- a stalled body is ended with the public `StreamReader.set_exception`; the exception is a
  TimeoutError so aiohttp's discard of the unread body after the 408 (its "lingering" read) stops
  quietly and closes the connection.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import resource
from collections.abc import Callable
from typing import Protocol, cast

from aiohttp import web

from corral.openai_errors import error_body
from corral.router.edge.client_limit_flags import ClientLimits
from corral.router.edge.client_limits import BodyReadTimeout, ClientLimitStats

log = logging.getLogger("corral.router")

# Descriptors beyond client and upstream sockets: listeners, log files, the event loop's own.
SPARE_FILES = 256

# After a stalled body's 408, how long the handler gets to send it before the connection is cut.
BODY_TIMEOUT_GRACE = 2.0


class Phase(enum.Enum):
    HEADER = "header"  # connected, or the next request's first byte arrived: waiting for its header
    BODY = "body"  # the app has the request; its body is still arriving
    HANDLING = "handling"  # the whole request is in; the app is answering (no client timeout)
    IDLE = "idle"  # between requests on a kept-alive connection


class WatchedBody(Protocol):
    def is_eof(self) -> bool: ...

    def set_exception(self, exc: BaseException) -> None: ...


class WatchedRequest(Protocol):
    """A request whose body the guard watches: aiohttp's, or the lean server's."""

    @property
    def content(self) -> WatchedBody: ...


class WatchedConnection(Protocol):
    """What the guard reads and sets on a connection: GuardedConnection around aiohttp's handler, or
    the lean server's own (corral.router.serving.connection)."""

    transport: asyncio.Transport | None
    phase: Phase
    since: float
    last_read: float
    request: WatchedRequest | None
    stalled_at: float | None
    header_bytes: int


class GuardedConnection(asyncio.Protocol):
    """One client connection: aiohttp's request handler inside, its phase and last read outside."""

    __slots__ = (
        "_guard",
        "_inner_factory",
        "header_bytes",
        "inner",
        "last_read",
        "phase",
        "request",
        "since",
        "stalled_at",
        "transport",
    )

    def __init__(self, guard: ConnectionGuard, inner_factory: Callable[[], asyncio.Protocol]) -> None:
        self._guard = guard
        self.inner: asyncio.Protocol | None = None
        self._inner_factory = inner_factory
        self.transport: asyncio.Transport | None = None
        self.phase = Phase.HEADER
        self.since = self.last_read = 0.0
        self.request: WatchedRequest | None = None
        self.stalled_at: float | None = None
        self.header_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        if not self._guard.admit(self, transport):
            return
        self.transport = transport
        self.since = self.last_read = self._guard.now()
        self.inner = self._inner_factory()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        self.last_read = self._guard.now()
        if self.phase is Phase.IDLE:
            self.phase, self.since, self.header_bytes = Phase.HEADER, self.last_read, 0
        if self.phase is Phase.HEADER:
            self.header_bytes += len(data)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.inner is None:
            return
        self._guard.forget(self)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


class ConnectionGuard:
    """Tracks the router's client connections and closes those a limit says must go."""

    def __init__(self, limits: ClientLimits, stats: ClientLimitStats) -> None:
        self._limits = limits
        self._stats = stats
        self._by_transport: dict[asyncio.BaseTransport, WatchedConnection] = {}
        self._listener: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        timeouts = [t for t in (limits.header_timeout, limits.body_timeout, limits.idle_timeout) if t > 0]
        self._sweep_every = min(1.0, max(0.05, min(timeouts) / 4)) if timeouts else 0.0

    # -- listening ---------------------------------------------------------------------------

    def protocol_factory(
        self, handler_factory: Callable[[], asyncio.Protocol]
    ) -> Callable[[], GuardedConnection]:
        """The protocol factory for loop.create_server: each connection guarded around
        `handler_factory()` (an aiohttp `runner.server`)."""
        return lambda: GuardedConnection(self, handler_factory)

    async def listen(
        self,
        handler_factory: Callable[[], asyncio.Protocol],
        host: str,
        port: int,
        backlog: int = 1024,
        reuse_port: bool = False,  # `corral router --workers N`: each worker binds the port (SO_REUSEPORT)
        watched_inside: bool = False,  # the factory's protocols report to the guard themselves (lean)
    ) -> asyncio.Server:
        loop = self._loop = asyncio.get_running_loop()
        make_room_for(self._limits)
        # every limit off: aiohttp's own handler, untouched (the baseline of the benchmark)
        watch = self._limits.watches_connections and not watched_inside
        factory = self.protocol_factory(handler_factory) if watch else handler_factory
        self._listener = await loop.create_server(
            factory, host, port, backlog=backlog, reuse_address=True, reuse_port=reuse_port
        )
        if self._sweep_every:
            self._sweeper = loop.call_later(self._sweep_every, self._sweep)
        return self._listener

    def stop_accepting(self) -> None:
        """Close the listening socket; open connections go on (aiohttp's shutdown ends them)."""
        if self._listener is not None:
            self._listener.close()

    async def close(self) -> None:
        self.stop_accepting()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None

    # -- connections -------------------------------------------------------------------------

    def now(self) -> float:
        return self._loop.time() if self._loop is not None else asyncio.get_running_loop().time()

    def admit(self, conn: WatchedConnection, transport: asyncio.Transport) -> bool:
        limit = self._limits.max_connections
        if limit and len(self._by_transport) >= limit:
            self._stats.rejected["max_connections"] += 1
            retry = self._limits.retry_after_seconds
            body = error_body(
                f"The router has {limit} client connections open, its limit (--max-connections); "
                f"retry after {retry} s.",
                "ServiceUnavailableError",
                503,
            )
            transport.write(_raw_response(503, "Service Unavailable", body, retry_after=retry))
            transport.close()
            return False
        self._by_transport[transport] = conn
        self._stats.open_connections = len(self._by_transport)
        return True

    def forget(self, conn: WatchedConnection) -> None:
        if conn.transport is not None:
            self._by_transport.pop(conn.transport, None)
            self._stats.open_connections = len(self._by_transport)
        conn.request = None

    # -- requests (from the app's middleware) ----------------------------------------------

    def request_started(self, request: web.BaseRequest) -> WatchedConnection | None:
        transport = request.transport
        conn = self._by_transport.get(transport) if transport is not None else None
        if conn is None:  # not a connection we accepted (a test server), or already gone
            return None
        conn.request = request
        conn.phase = Phase.HANDLING if request.content.is_eof() else Phase.BODY
        conn.since = self.now()
        conn.stalled_at = None
        return conn

    def request_finished(self, request: web.BaseRequest, started: object) -> None:
        if started is not None and getattr(started, "request", None) is request:
            conn = cast(WatchedConnection, started)  # what request_started returned
            conn.request = None
            conn.phase, conn.since = Phase.IDLE, self.now()

    # -- the sweep ------------------------------------------------------------------------------

    def _sweep(self) -> None:
        assert self._loop is not None
        self._sweeper = self._loop.call_later(self._sweep_every, self._sweep)
        now = self._loop.time()
        limits = self._limits
        for conn in list(self._by_transport.values()):
            phase = conn.phase
            if phase is Phase.HEADER:
                if limits.header_timeout and now - conn.since > limits.header_timeout:
                    self._close(conn, "header_timeout", partial_header=conn.header_bytes > 0)
            elif phase is Phase.IDLE:
                if limits.idle_timeout and now - conn.since > limits.idle_timeout:
                    self._close(conn, "idle_timeout")
            elif phase is Phase.BODY:
                self._check_body(conn, now)

    def _check_body(self, conn: WatchedConnection, now: float) -> None:
        request = conn.request
        timeout = self._limits.body_timeout
        if request is None or request.content.is_eof():
            conn.phase = Phase.HANDLING
            return
        if not timeout or now - conn.last_read <= timeout:
            return
        if conn.stalled_at is None:
            # the read in the app raises; its middleware answers 408 and aiohttp closes the connection
            conn.stalled_at = now
            self._stats.closed["body_timeout"] += 1
            request.content.set_exception(BodyReadTimeout(f"request body silent for more than {timeout:g} s"))
        elif now - conn.stalled_at > BODY_TIMEOUT_GRACE and conn.transport is not None:
            conn.transport.close()  # nothing read the body: no 408 will come

    def _close(self, conn: WatchedConnection, reason: str, partial_header: bool = False) -> None:
        transport = conn.transport
        if transport is None or transport.is_closing():
            return
        self._stats.closed[reason] += 1
        if partial_header and not transport.get_write_buffer_size():
            timeout = self._limits.header_timeout
            body = error_body(
                f"The request header did not arrive within {timeout:g} s (the router's --header-timeout).",
                "RequestTimeoutError",
                408,
            )
            transport.write(_raw_response(408, "Request Timeout", body))
        transport.close()


def _raw_response(status: int, reason: str, body: bytes, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 answer written straight to a transport no aiohttp handler owns."""
    head = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if retry_after is not None:
        head.append(f"Retry-After: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body


def make_room_for(limits: ClientLimits) -> None:
    """Raise the soft open-file limit toward the hard one so that --max-connections client sockets
    and --max-in-flight upstream ones fit; say so in one line when they cannot."""
    if not limits.max_connections:
        return
    wanted = limits.max_connections + limits.max_in_flight + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft < wanted:
        log.warning(
            "the open-file limit (%d, hard %d) is below --max-connections %d + --max-in-flight %d + %d "
            "spare; raise it (ulimit -n %d) or lower --max-connections",
            soft,
            hard,
            limits.max_connections,
            limits.max_in_flight,
            SPARE_FILES,
            wanted,
        )
