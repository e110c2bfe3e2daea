"""One attempt of a request on the endpoint it was sent to, as the endpoint counts it: sent (its
requests, in flight, its prefill queue), dispatching until the engine answers (a removal's
acknowledgement waits for that), out of the prefill queue at the first byte, and all of it released
when the attempt ends, however it ends. The proxy's attempts, the P/D prefill leg and the endpoint
picker's picks (corral.epp.flight) share it."""

from __future__ import annotations

from corral.router.datapath.upstream import UpstreamResponse
from corral.router.membership.endpoint import Endpoint


class Dispatch:
    """Counts one attempt on `endpoint` from its creation (the request is about to go) to `release`
    (in a `finally`), with `prefill` uncached prompt tokens as the pick priced them."""

    __slots__ = ("_dispatching", "_prefill", "_upstream", "endpoint")

    def __init__(self, endpoint: Endpoint, prefill: int) -> None:
        self.endpoint = endpoint
        endpoint.requests_sent += 1
        endpoint.in_flight += 1
        if prefill:
            endpoint.prefill_sent(prefill)
        endpoint.dispatching += 1  # until the engine answers: a removal's ack waits for this
        self._prefill = prefill
        self._dispatching = True
        self._upstream: UpstreamResponse | None = None

    def answered(self, upstream: UpstreamResponse | None = None) -> None:
        """The engine answered (its status and headers): no longer dispatching; the answer, when the
        router holds it, is closed at `release` (the endpoint picker holds none: the gateway relays)."""
        self._upstream = upstream
        self.endpoint.dispatching -= 1
        self._dispatching = False

    def first_byte(self) -> None:
        """The answer's first byte came: the request leaves the endpoint's prefill queue."""
        if self._prefill:
            self.endpoint.prefill_done(self._prefill)
            self._prefill = 0

    def release(self) -> None:
        """The attempt ended: out of every count it is still in, and its answer closed."""
        endpoint = self.endpoint
        if self._prefill:
            endpoint.prefill_done(self._prefill)
            self._prefill = 0
        endpoint.in_flight -= 1
        if self._dispatching:
            endpoint.dispatching -= 1
            self._dispatching = False
        if self._upstream is not None:
            self._upstream.close()
