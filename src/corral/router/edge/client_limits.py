"""What one client may cost the router, per request: the limits' counters on /metrics, and the
middleware that answers 413 (body too large), 408 (body stalled) and 503 (too many requests in flight)
in OpenAI's error shape. The settings and their flags are corral.router.edge.client_limit_flags;
per-connection limits (header and idle timeouts, open connections) live in
corral.router.edge.client_connections."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterator
from typing import Protocol

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client.core import GaugeMetricFamily, Metric

from corral.metric_families import labelled_counter, labelled_gauge
from corral.openai_errors import error_response
from corral.router.edge.client_limit_flags import ClientLimits, format_size

# Closed-connection reasons and rejected-request reasons, as they appear in metric labels.
CLOSE_REASONS = ("header_timeout", "body_timeout", "idle_timeout")
REJECT_REASONS = ("max_connections", "max_in_flight", "body_too_large")


class ClientLimitStats:
    """Counters bumped by the middleware and the connection guard, read at scrape time."""

    __slots__ = ("closed", "in_flight", "open_connections", "rejected")

    def __init__(self) -> None:
        self.open_connections = 0
        self.in_flight = 0
        self.closed = dict.fromkeys(CLOSE_REASONS, 0)
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)


class ClientLimitsCollector:
    """The limits, what they closed and refused, and what is open now, as metric families."""

    def __init__(self, limits: ClientLimits, stats: ClientLimitStats) -> None:
        self._limits = limits
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats
        yield GaugeMetricFamily(
            "corral_router_client_connections_open",
            "Client connections open to the router now.",
            value=s.open_connections,
        )
        yield GaugeMetricFamily(
            "corral_router_client_requests_in_flight",
            "Client requests being handled now, counted against --max-in-flight (the router's own "
            "/health, /metrics, /v1/models and /v1/fleet are not).",
            value=s.in_flight,
        )
        yield labelled_counter(
            "corral_router_client_connections_closed",
            "Client connections the router closed, by reason: header_timeout (--header-timeout), "
            "body_timeout (--body-timeout; answered 408), idle_timeout (--idle-timeout).",
            ["reason"],
            {(reason,): n for reason, n in s.closed.items()},
        )
        yield labelled_counter(
            "corral_router_client_rejected",
            "Client connections or requests refused by a limit, by reason: max_connections (closed "
            "on accept), max_in_flight (503), body_too_large (413).",
            ["reason"],
            {(reason,): n for reason, n in s.rejected.items()},
        )
        yield labelled_gauge(
            "corral_router_client_limit",
            "The router's client-side limits as configured (0: off).",
            ["limit"],
            {(name,): value for name, value in self._limits.as_gauges().items()},
        )


class BodyReadTimeout(asyncio.TimeoutError):
    """Set on a request's payload when its body stalls. A TimeoutError, so that aiohttp's discard of
    an unread body after the 408 stops at it quietly instead of logging an unhandled error."""


class RequestPhases(Protocol):
    """Told when a request reaches the app and when it leaves (corral.router.edge.client_connections);
    what `request_started` returns is handed back to `request_finished`."""

    def request_started(self, request: web.BaseRequest) -> object: ...

    def request_finished(self, request: web.BaseRequest, started: object) -> None: ...


def client_limits_middleware(
    limits: ClientLimits, stats: ClientLimitStats, phases: RequestPhases, exempt_paths: Collection[str]
) -> Middleware:
    """Refuses a declared body over the limit before reading it, turns a chunked body that grows
    over it (aiohttp's client_max_size) into 413 and a stalled body into 408, and caps the requests
    in flight; `exempt_paths` (the router's own cheap endpoints) stay answerable during overload."""
    exempt = frozenset(exempt_paths)
    max_body = limits.max_body_bytes
    max_in_flight = limits.max_in_flight

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = phases.request_started(request)
        try:
            declared = request.content_length
            if max_body and declared is not None and declared > max_body:
                stats.rejected["body_too_large"] += 1
                return body_too_large(max_body, declared)
            counted = request.path not in exempt
            if counted:
                if max_in_flight and stats.in_flight >= max_in_flight:
                    stats.rejected["max_in_flight"] += 1
                    return overloaded(max_in_flight, limits.retry_after_seconds)
                stats.in_flight += 1
            try:
                return await handler(request)
            except BodyReadTimeout:
                return body_stalled(limits.body_timeout)
            except web.HTTPRequestEntityTooLarge:
                stats.rejected["body_too_large"] += 1
                return body_too_large(max_body, None)
            finally:
                if counted:
                    stats.in_flight -= 1
        finally:
            phases.request_finished(request, started)

    return middleware


def body_too_large(limit: int, declared: int | None) -> web.Response:
    size = f"is {declared} bytes" if declared is not None else "grew past that"
    answer = error_response(
        413,
        f"The request body {size}; the router accepts at most {format_size(limit)} ({limit} bytes). "
        "Send a smaller body, or start the router with a larger --max-body-size.",
        "RequestTooLargeError",
        "body",
    )
    answer.force_close()  # the rest of the body is not read
    return answer


def body_stalled(timeout: float) -> web.Response:
    answer = error_response(
        408,
        f"The request body stopped arriving for {timeout:g} s (the router's --body-timeout); "
        "send the whole body without pausing, or start the router with a larger --body-timeout.",
        "RequestTimeoutError",
        "body",
    )
    answer.force_close()
    return answer


def overloaded(max_in_flight: int, retry_after: int) -> web.Response:
    return error_response(
        503,
        f"The router is handling {max_in_flight} requests, its limit (--max-in-flight); "
        f"retry after {retry_after} s.",
        "ServiceUnavailableError",
        headers={"Retry-After": str(retry_after)},
    )
