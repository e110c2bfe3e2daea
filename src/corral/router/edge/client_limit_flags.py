"""The `corral router` client limits: their settings (`ClientLimits`) and the flags that set them
(`client_limit_options`, sizes like `32MiB`). Only click here, so that `corral router --help` starts
fast; what enforces them is corral.router.edge.client_limits and client_connections."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

MIB = 1024 * 1024


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
