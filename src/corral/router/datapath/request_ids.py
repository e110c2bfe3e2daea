"""The names the router gives requests that arrive without a usable X-Request-Id: 32 hex digits, a
random per-process prefix and a counter, so that ids stay unique across worker processes and
restarts without the cost of a uuid4 per request."""

from __future__ import annotations

import secrets


class RequestIds:
    """Hands out `<16 random hex><16 hex counter>`; the prefix is drawn once per instance (64 bits:
    two processes share one with a chance of 2**-64)."""

    __slots__ = ("_next", "_prefix")

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._next = 0

    def new(self) -> str:
        self._next += 1
        return f"{self._prefix}{self._next:016x}"
