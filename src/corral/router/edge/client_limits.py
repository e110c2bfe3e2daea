"""What one client may cost the router, per request: the limits' settings, their counters on
/metrics, and the middleware that answers 413 (body too large), 408 (body stalled) and 503 (too
many requests in flight) in OpenAI's error shape. Per-connection limits (header and idle timeouts,
open connections) live in corral.router.edge.client_connections."""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import click
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client.core import GaugeMetricFamily, Metric

from corral.metric_families import labelled_counter, labelled_gauge
from corral.openai_errors import error_response

MIB = 1024 * 1024

# Closed-connection reasons and rejected-request reasons, as they appear in metric labels.
CLOSE_REASONS = ("header_timeout", "body_timeout", "idle_timeout")
REJECT_REASONS = ("max_connections", "max_in_flight", "body_too_large")


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """The `corral router` client-side limits; 0 turns one off."""

    header_timeout: float = 10.0  # from connect (or a request's first byte) to its whole header
    body_timeout: float = 30.0  # longest silence while a request body is arriving
    idle_timeout: float = 75.0  # an open connection between requests (above common LB idle timeouts)
    max_connections: int = 4096
    max_in_flight: int = 1024  # requests being handled, not counting the router's own endpoints
    max_body_bytes: int = 32 * MIB
    retry_after_seconds: int = 1  # told to clients refused for max_in_flight or max_connections

    @property
    def watches_connections(self) -> bool:
        """Whether any limit needs each connection tracked (corral.router.edge.client_connections)."""
        return bool(self.header_timeout or self.body_timeout or self.idle_timeout or self.max_connections)

    @property
    def watches_requests(self) -> bool:
        """Whether any limit needs the middleware."""
        return bool(self.watches_connections or self.max_in_flight or self.max_body_bytes)

    def as_gauges(self) -> dict[str, float]:
        return {
            "header_timeout_seconds": self.header_timeout,
            "body_timeout_seconds": self.body_timeout,
            "idle_timeout_seconds": self.idle_timeout,
            "max_connections": self.max_connections,
            "max_in_flight": self.max_in_flight,
            "max_body_bytes": self.max_body_bytes,
        }


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


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": MIB, "g": 1024 * MIB}


def parse_size(text: str) -> int:
    """Bytes from `33554432`, `32MiB`, `32M`, `512KiB`, `1GiB` (binary units, case-insensitive)."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size; write bytes or a number with KiB, MiB or GiB, e.g. 32MiB")
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "").lower()[:1]])


def format_size(n: int) -> str:
    for unit, scale in (("GiB", 1024 * MIB), ("MiB", MIB), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


class ByteSize(click.ParamType[int, Any]):
    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def client_limit_options(command: Callable[..., None]) -> Callable[..., None]:
    """The `corral router` flags of the client limits, handed to the command as one
    `client_limits: ClientLimits` argument."""
    defaults = ClientLimits()

    @functools.wraps(command)
    def with_limits(
        *args: Any,
        header_timeout: float,
        body_timeout: float,
        idle_timeout: float,
        max_connections: int,
        max_in_flight: int,
        max_body_size: int,
        **kwargs: Any,
    ) -> None:
        limits = ClientLimits(
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            idle_timeout=idle_timeout,
            max_connections=max_connections,
            max_in_flight=max_in_flight,
            max_body_bytes=max_body_size,
        )
        command(*args, client_limits=limits, **kwargs)

    seconds = click.FloatRange(min=0)
    options = [
        click.option(
            "--header-timeout",
            default=defaults.header_timeout,
            show_default=True,
            type=seconds,
            help="Seconds a client has to send a request's whole header, from connecting or from the "
            "request's first byte; then the connection is closed (a slowloris defence). 0: off.",
        ),
        click.option(
            "--body-timeout",
            default=defaults.body_timeout,
            show_default=True,
            type=seconds,
            help="Seconds a request body may stop arriving; then 408 and the connection is closed. 0: off.",
        ),
        click.option(
            "--idle-timeout",
            default=defaults.idle_timeout,
            show_default=True,
            type=seconds,
            help="Seconds a kept-alive client connection may sit idle between requests. Keep it above "
            "the idle timeout of any load balancer in front. 0: off.",
        ),
        click.option(
            "--max-connections",
            default=defaults.max_connections,
            show_default=True,
            type=click.IntRange(min=0),
            help="Client connections open at once; one more is answered 503 and closed at once. "
            "Needs as many file descriptors (ulimit -n) plus the upstream ones. 0: no cap.",
        ),
        click.option(
            "--max-in-flight",
            default=defaults.max_in_flight,
            show_default=True,
            type=click.IntRange(min=0),
            help="Requests handled at once; one more is answered 503 with Retry-After, never queued. "
            "/health, /metrics, /v1/models and /v1/fleet are not counted. 0: no cap.",
        ),
        click.option(
            "--max-body-size",
            default="32MiB",
            show_default=True,
            type=ByteSize(),
            help="Largest request body (bytes, or with KiB/MiB/GiB); a larger one is answered 413 "
            "without being read (a declared length) or as soon as it grows past it (chunked). 0: no limit.",
        ),
    ]
    decorated: Callable[..., None] = with_limits
    for option in reversed(options):
        decorated = option(decorated)
    return decorated
