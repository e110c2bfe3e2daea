"""One picked request as the endpoints count it while the gateway carries it: in flight and dispatching on
its endpoint from the pick (so a removal's acknowledgement waits for it, as for the router's own
requests), moved to the endpoint the gateway says served it, answered at the response headers, its first
token and inter-token gaps from the response body, ended at the body's end, released when the exchange
closes however it closes. The router's per-endpoint figures (in flight, TTFT, errors) come out the same
as behind the router, so load-aware and prefix policies read them unchanged."""

from __future__ import annotations

import time

from corral.engine.stream_ending import StreamEnding
from corral.epp.decision import Pick
from corral.router.datapath.dispatch import Dispatch
from corral.router.edge.tenants import TenantGate
from corral.router.membership.endpoint import Endpoint
from corral.router.telemetry.metrics import RouterMetrics
from corral.router.telemetry.traffic import StreamTimes

CLIENT_CLOSED = 499  # the exchange closed before the response ended (as the router counts a client that left)


class Flight:
    __slots__ = (
        "_dispatch",
        "_dispatched",
        "_ending",
        "_metrics",
        "_prefill",
        "_start",
        "_status",
        "_streaming",
        "_tail",
        "_times",
        "ended",
        "pick",
    )

    def __init__(self, pick: Pick, metrics: RouterMetrics, start: float) -> None:
        self.pick = pick
        self._metrics = metrics
        self._start = start  # perf_counter() at the request's headers
        self._dispatched = time.monotonic()
        self._dispatch = Dispatch(pick.endpoint, pick.route.prefill_tokens)
        # the prefill engine of a P/D pair is busy with the prompt until the decode engine answers
        self._prefill = Dispatch(pick.prefill, 0) if pick.prefill is not None else None
        self._status = 0
        self._streaming = False
        self._ending: StreamEnding | None = None
        self._times: StreamTimes | None = None
        self._tail = (b"", b"")  # the body's last two chunks: a stream's usage event is among them
        self.ended = False

    @property
    def endpoint(self) -> Endpoint:
        return self._dispatch.endpoint

    def served_by(self, endpoint: Endpoint) -> None:
        """The gateway reports another endpoint of the list served the request (the pick failed there):
        the pick counts as a failure on its endpoint, and the request is in flight on `endpoint`."""
        if endpoint is self._dispatch.endpoint:
            return
        self._dispatch.endpoint.traffic.ended(failed=True)
        self._dispatch.release()
        self._dispatched = time.monotonic()
        self._dispatch = Dispatch(endpoint, 0)

    def answered(self, status: int, content_type: str) -> None:
        """The response headers: the engine answered (no longer dispatching)."""
        self._status = status
        self._streaming = content_type.startswith("text/event-stream")
        self._dispatch.answered()
        if self._prefill is not None:
            self._prefill.release()
            self._prefill = None
        if self._streaming and status < 400:
            endpoint = self._dispatch.endpoint
            self._ending = StreamEnding()
            self._times = StreamTimes(endpoint.traffic, self._dispatched, endpoint.routable_from)

    def body(self, chunk: bytes) -> None:
        """A chunk of the response body."""
        if not chunk:
            return
        if not self._tail[1]:  # the first byte: the router's TTFT histogram counts from the request
            self._metrics.ttft.observe(time.perf_counter() - self._start)
        self._dispatch.first_byte()
        self._tail = (self._tail[1], chunk)
        if self._ending is not None and self._times is not None:
            self._ending.feed(chunk)
            self._times.feed(chunk, self._ending.tokens_emitted)

    def end(self) -> None:
        """The response body ended: the request's figures, as the router's relay records them."""
        if self.ended:
            return
        self.ended = True
        endpoint, status, metrics = self._dispatch.endpoint, self._status, self._metrics
        failed = status >= 500 or (self._ending is not None and self._ending.failure is not None)
        endpoint.traffic.ended(failed=failed)
        if status < 400 and not self._streaming:
            endpoint.traffic.first_token(
                time.monotonic() - self._dispatched, self._dispatched, endpoint.routable_from
            )
        expected = self.pick.route.expected_hit
        if expected is not None and status < 400:  # what the engine's cache served
            expected.answered(self._tail[0] + self._tail[1])
        metrics.count_request(self.pick.route.model, status)
        if status >= 500:
            metrics.errors += 1
        metrics.duration.observe(time.perf_counter() - self._start)
        self._release_tenant(status)

    def release(self) -> None:
        """The exchange closed: out of every count; a response that never ended counts as a client that
        left (the gateway or its client closed the stream)."""
        if not self.ended:
            self.ended = True
            self._metrics.count_request(self.pick.route.model, CLIENT_CLOSED)
            self._release_tenant(CLIENT_CLOSED)
        self._dispatch.release()
        if self._prefill is not None:
            self._prefill.release()
            self._prefill = None

    def _release_tenant(self, code: int) -> None:
        if self.pick.tenant is not None:
            TenantGate.release(self.pick.tenant, code)
