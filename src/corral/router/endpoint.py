"""One backend engine as the router sees it: where it is, where it was learnt from, what it serves,
its lifecycle state, the requests the router has in flight to it, and whether it is ejected after a
failure."""

from __future__ import annotations

import time
from typing import Any

from corral.engine_state import EngineState

# Repeated ejections double the ejection time, up to this many times the base.
MAX_EJECTION_FACTOR = 32


class Endpoint:
    """A backend engine. `in_flight` is the router's own count of requests it has open there."""

    __slots__ = (
        "consecutive_failures",
        "ejected_until",
        "in_flight",
        "last_event_version",
        "model_cards",
        "models",
        "name",
        "reason",
        "requests_sent",
        "since",
        "source",
        "state",
        "url",
    )

    def __init__(
        self,
        url: str,
        models: frozenset[str] = frozenset(),
        state: EngineState = EngineState.STARTING,
        reason: str = "not yet seen",
        *,
        source: str = "static",
        name: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        # Where membership learnt of it (static | file | k8s) and its name there (a pod's ns/name).
        self.source = source
        self.name = name
        # The resourceVersion of the last Kubernetes event about it; None for other sources.
        self.last_event_version: str | None = None
        # Requests the router has sent here, counted when the endpoint is picked (before any I/O).
        self.requests_sent = 0
        self.models = models
        # The backend's own /v1/models entries, kept whole so the router's union keeps their fields.
        self.model_cards: tuple[dict[str, Any], ...] = ()
        self.state = state
        self.reason = reason
        self.since = time.time()
        self.in_flight = 0
        self.ejected_until = 0.0  # time.monotonic() deadline; 0 when not ejected
        self.consecutive_failures = 0

    def __repr__(self) -> str:
        return f"Endpoint({self.url!r}, {self.state}, in_flight={self.in_flight})"

    def set_state(self, state: EngineState, reason: str) -> bool:
        """Move to `state`; returns whether anything changed (a new reason alone counts)."""
        if state is self.state and reason == self.reason:
            return False
        if state is not self.state:
            self.since = time.time()
        self.state = state
        self.reason = reason
        return True

    def is_ejected(self, now: float) -> bool:
        return self.ejected_until > now

    def routable(self, now: float) -> bool:
        return self.state is EngineState.READY and self.ejected_until <= now

    def routing_verdict(self, now: float) -> str:
        """Why the endpoint does or does not take requests now, in words for /v1/fleet."""
        if self.state is not EngineState.READY:
            return f"not routable: {self.state.value} ({self.reason})"
        if self.ejected_until > now:
            return f"not routable: ejected for {self.ejected_until - now:.1f} s more after a failure"
        return "routable: READY and not ejected"

    def eject(self, now: float, base_seconds: float) -> float | None:
        """Eject after a connection failure; each further failure in a row doubles the time.

        Failures while already ejected (requests that were in flight together) count once, so
        one crash does not blow the backoff up. Returns the ejection length, or None if the
        endpoint was already ejected.
        """
        if self.ejected_until > now:
            return None
        factor: int = min(2**self.consecutive_failures, MAX_EJECTION_FACTOR)
        self.consecutive_failures += 1
        seconds = base_seconds * factor
        self.ejected_until = now + seconds
        return seconds

    def record_success(self) -> None:
        if self.consecutive_failures:
            self.consecutive_failures = 0

    def ejected_until_wall(self, now: float) -> float | None:
        """The ejection deadline on the wall clock, for display; None when not ejected."""
        if self.ejected_until <= now:
            return None
        return time.time() + (self.ejected_until - now)
