"""The lean server: which requests it answers itself, and the edge checks it makes on them, in the
order aiohttp's route and middlewares make them in the router's app (corral.router.app):

1. `Expect` (corral.router.edge.expect_continue's rules): 417 for another expectation, the tenant's
   401 and a declared body over --max-body-size's 413 before `100 Continue`, sent only when the
   request's turn has come (never into another request's answer);
2. the client limits (corral.router.edge.client_limits): the connection guard told the request is
   in, 413 for a declared body over the limit, 503 + Retry-After over --max-in-flight;
3. admin access: the inference paths are neither admin nor probe paths, and the lean server listens
   on the main port only, so corral.router.edge.admin_access lets every one of them through;
4. tenants (corral.router.edge.tenants): 401, 429, and the tenant's in-flight slot;
5. the proxy; a body that stalls is answered 408, one that grows too large 413 (both close).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from corral.openai_errors import error_response
from corral.router.datapath.proxy import Proxy
from corral.router.edge.client_connections import ConnectionGuard, Phase
from corral.router.edge.client_limit_flags import ClientLimits
from corral.router.edge.client_limits import (
    BodyReadTimeout,
    ClientLimitStats,
    body_stalled,
    body_too_large,
    overloaded,
)
from corral.router.edge.expect_continue import CONTINUE, refuse_expectation
from corral.router.edge.parse_errors import ParseErrorLog
from corral.router.edge.tenants import CLIENT_CLOSED, TenantGate
from corral.router.serving.connection import LeanConnection, LeanReply
from corral.router.serving.request import BodyTooLarge, LeanRequest
from corral.router.serving.wire import DateHeader, answer_of

log = logging.getLogger("corral.router")


@dataclass(frozen=True, slots=True)
class HotPath:
    """What the router's app hands the lean server: the paths it may answer and what answers them."""

    exact_paths: frozenset[str]  # inference POSTs routed by exact match
    prefix: str  # ... and every POST under it
    not_under_prefix: frozenset[str]  # except these (the app answers them itself)
    proxy: Callable[[], Proxy]  # made when the app starts
    limits: ClientLimits
    stats: ClientLimitStats
    gate: TenantGate | None


class LeanServer:
    def __init__(
        self,
        hot: HotPath,
        guard: ConnectionGuard | None,
        handoff: Callable[[], asyncio.Protocol],
        parse_log: ParseErrorLog,
    ) -> None:
        self._hot = hot
        self.guard = guard  # None: no limit watches connections
        self.handoff = handoff  # aiohttp's request handler for one connection (runner.server)
        self.parse_log = parse_log
        self.max_body = hot.limits.max_body_bytes
        self.date = DateHeader()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.connections: set[LeanConnection] = set()

    async def shutdown(self, grace: float) -> None:
        """Close idle connections now, the others once their answers are out or after `grace` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while True:
            # a connection handed to aiohttp is ended by aiohttp's own shutdown (runner.cleanup)
            ours = [conn for conn in self.connections if not conn.handed_off]
            for conn in ours:
                if conn.idle():
                    conn.close()
            if not any(not conn.idle() for conn in ours) or loop.time() >= deadline:
                break
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            if not conn.handed_off:
                conn.close()

    def protocol(self) -> LeanConnection:
        """The protocol factory for loop.create_server."""
        return LeanConnection(self)

    def now(self) -> float:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop.time()

    def serves(self, target: str) -> bool:
        """Whether a POST to `target` is an inference request the lean server answers itself: a plain
        path (no query, percent-escape or dot segment, which aiohttp would rewrite before routing)."""
        hot = self._hot
        if target in hot.exact_paths:
            return True
        return (
            target.startswith(hot.prefix)
            and target not in hot.not_under_prefix
            and "%" not in target
            and "?" not in target
            and "/." not in target
            and "//" not in target
            and target.isascii()
        )

    async def answer(self, conn: LeanConnection, request: LeanRequest) -> bool:
        """Answer `request` (its turn has come); whether the connection stays open."""
        hot = self._hot
        reply = LeanReply(conn, request)
        expectation = request.headers.get("Expect")
        if expectation is not None:
            refused = self._expect(conn, request, expectation)
            if refused is not None:
                return await self._send(reply, refused)
        guard = self.guard
        if guard is not None:
            conn.request, conn.stalled_at, conn.since = request, None, self.now()
            conn.phase = Phase.HANDLING if request.is_eof() else Phase.BODY
        limits, stats = hot.limits, hot.stats
        try:
            if limits.watches_requests:
                declared, max_body = request.declared, limits.max_body_bytes
                if max_body and declared is not None and declared > max_body:
                    stats.rejected["body_too_large"] += 1
                    return await self._send(reply, body_too_large(max_body, declared))
                if limits.max_in_flight and stats.in_flight >= limits.max_in_flight:
                    stats.rejected["max_in_flight"] += 1
                    return await self._send(
                        reply, overloaded(limits.max_in_flight, limits.retry_after_seconds)
                    )
                stats.in_flight += 1
            try:
                return await self._admitted(request, reply)
            finally:
                if limits.watches_requests:
                    stats.in_flight -= 1
        finally:
            if guard is not None and conn.request is request:
                conn.request = None
                conn.phase, conn.since = Phase.IDLE, self.now()

    async def _admitted(self, request: LeanRequest, reply: LeanReply) -> bool:
        gate = self._hot.gate
        if gate is not None:
            admitted = gate.admit(request.headers, request.method)
            if isinstance(admitted, web.Response):
                return await self._send(reply, admitted)
            request.tenant = admitted
        code = 500
        try:
            code = await self._hot.proxy().handle(request, reply)
        except BodyReadTimeout:
            code = 408
            reply.close_after()
            if not reply.started:
                return await self._send(reply, body_stalled(self._hot.limits.body_timeout))
        except BodyTooLarge:
            code = 413
            self._hot.stats.rejected["body_too_large"] += 1
            if not reply.started:
                return await self._send(reply, body_too_large(self.max_body, None))
            reply.close_after()
        except ConnectionResetError:
            code = CLIENT_CLOSED
            reply.close_after()  # a malformed body: the connection's 400 follows
        except asyncio.CancelledError:
            code = CLIENT_CLOSED
            raise
        except Exception:
            log.exception("request %s %s failed in the router", request.method, request.path)
            reply.close_after()
            if not reply.started:
                return await self._send(
                    reply, error_response(500, "The router failed on this request.", "InternalServerError")
                )
        finally:
            if request.tenant is not None and gate is not None:
                gate.release(request.tenant, code)
        return reply.keep_alive

    def _expect(self, conn: LeanConnection, request: LeanRequest, expectation: str) -> web.Response | None:
        """corral.router.edge.expect_continue's decision, made when the request's turn has come."""
        if request.version != "1.1":
            return None  # HTTP/1.0 has no interim answers
        hot = self._hot
        refused = refuse_expectation(
            expectation, request.headers, request.declared, hot.limits, hot.stats, hot.gate
        )
        if refused is None:
            conn.write(CONTINUE)  # as aiohttp does, even when the body came with the head
        return refused

    @staticmethod
    async def _send(reply: LeanReply, response: web.Response) -> bool:
        answer, keep_alive = answer_of(response)
        if not keep_alive:
            reply.close_after()
        await reply.send(answer)
        return reply.keep_alive
