"""The router's answer to `Expect: 100-continue`: refuse before the client uploads, or invite the body.

aiohttp runs a route's expect handler before any middleware, and by default it answers `100 Continue`
to everyone — so a client without a tenant's key, or with a body over `--max-body-size`, would be
invited to upload megabytes only to be refused once they arrived. Here the same checks the middlewares
make run first: a missing or wrong key gets its 401, a declared length over the limit its 413, each
counted as the middleware would; everyone else gets `100 Continue`. An expectation other than
`100-continue` is a 417 (RFC 9110 §10.1.1).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from corral.openai_errors import error_response
from corral.router.edge.client_limit_flags import ClientLimits
from corral.router.edge.client_limits import ClientLimitStats, body_too_large
from corral.router.edge.tenants import TenantGate

ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def refuse_expectation(
    expectation: str,
    headers: Mapping[str, str],
    declared: int | None,
    limits: ClientLimits,
    stats: ClientLimitStats,
    gate: TenantGate | None,
) -> web.Response | None:
    """The answer that refuses an HTTP/1.1 request's `Expect` before its body is sent (417, the
    tenant's 401, a declared body's 413; counted), or None: send `100 Continue`."""
    expectation = expectation.strip().lower()
    if expectation != "100-continue":
        return error_response(
            417,
            f"The router meets only `Expect: 100-continue`, not {expectation[:40]!r}; "
            "send the request without that Expect header.",
            "ExpectationFailedError",
            "Expect",
        )
    if gate is not None:
        refused = gate.refuse_unauthenticated(headers)
        if refused is not None:
            refused.force_close()  # the body the client may still send is not wanted
            return refused
    max_body = limits.max_body_bytes
    if max_body and declared is not None and declared > max_body:
        stats.rejected["body_too_large"] += 1
        return body_too_large(max_body, declared)
    return None


def expect_handler(limits: ClientLimits, stats: ClientLimitStats, gate: TenantGate | None) -> ExpectHandler:
    async def decide(request: web.Request) -> web.StreamResponse | None:
        if request.version < (1, 1):
            return None  # HTTP/1.0 has no interim answers: ignore the expectation (RFC 9110 §10.1.1)
        expectation = request.headers.get("Expect", "")
        refused = refuse_expectation(
            expectation, request.headers, request.content_length, limits, stats, gate
        )
        if refused is not None:
            return refused
        await request.writer.write(CONTINUE)
        request.writer.output_size = 0  # the answer proper has not started
        return None

    return decide
