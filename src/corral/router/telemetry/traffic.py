"""What the router saw of one endpoint's answers (`EndpointTraffic`, kept on each `Endpoint`): requests
that ended, those the serving side failed, TTFT and inter-token gaps on `LATENCY_BOUNDS`, and the
first request's TTFT since the endpoint last became routable, kept apart as its warmup.

The proxy feeds it per attempt: an attempt that fails before any byte (then retried elsewhere or
not) is an ended request and an error of the endpoint that was picked. "Became routable" is the
slow-start seam, `Endpoint.routable_from` (first READY, READY again after a wake or a restart, its
group whole again, back from an ejection): the first TTFT of an attempt dispatched at or after it is
the warmup and stays out of the steady histogram. Readers take windows as differences of two
readings (`TrafficFigures.minus`); nothing here keeps samples.
"""

from __future__ import annotations

import time
from typing import Any

from corral.contracts.traffic import LATENCY_BOUNDS, TrafficFigures, trimmed
from corral.router.telemetry.histogram import Histogram


class EndpointTraffic:
    """Cumulative counters for one endpoint since it was listed. Cheap on the data path: a counter
    bump per attempt, a bisect into `LATENCY_BOUNDS` per first token and per inter-token gap."""

    __slots__ = ("errors", "itl", "requests", "ttft", "warmup_for", "warmup_ttft_s")

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.ttft = Histogram(LATENCY_BOUNDS)
        self.itl = Histogram(LATENCY_BOUNDS)
        self.warmup_ttft_s: float | None = None
        # the `routable_from` whose warmup has been taken; None: none yet since the endpoint was listed
        self.warmup_for: float | None = None

    def ended(self, failed: bool) -> None:
        """One attempt ended: answered (any status), cut, or failed before an answer. `failed` when
        the serving side failed it (5xx, connection failure, stream cut or ended by the engine's
        error or abort event); a client's own 4xx or a client that went away is not."""
        self.requests += 1
        if failed:
            self.errors += 1

    def first_token(self, seconds: float, dispatched_at: float, routable_from: float) -> None:
        """An attempt's time to first token (a stream's first token-carrying chunk, a whole non-stream
        answer), from when the endpoint was picked. The first one of an attempt dispatched since the
        endpoint became routable (`routable_from`, on the same clock as `dispatched_at`) is its
        warmup, not a steady-state sample."""
        if self.warmup_for != routable_from and dispatched_at >= routable_from:
            self.warmup_for = routable_from
            self.warmup_ttft_s = seconds
            return
        self.ttft.observe(seconds)

    def gap(self, seconds: float) -> None:
        """The time between two successive token-carrying chunks of a stream."""
        self.itl.observe(seconds)

    def to_json(self) -> dict[str, Any]:
        """`/v1/fleet`'s `traffic`: a `TrafficFigures` body, built without a model per endpoint (a
        thousand endpoints per read). Histogram bounds are left out: `LATENCY_BOUNDS`."""
        return {
            "requests": self.requests,
            "errors": self.errors,
            "ttft": _latency(self.ttft),
            "itl": _latency(self.itl),
            "warmup_ttft_s": None if self.warmup_ttft_s is None else round(self.warmup_ttft_s, 6),
        }

    def figures(self) -> TrafficFigures:
        return TrafficFigures.model_validate(self.to_json())


def _latency(histogram: Histogram) -> dict[str, Any]:
    return {"counts": trimmed(histogram.buckets), "sum": round(histogram.total, 6)}


class StreamTimes:
    """One relayed stream's token times, fed every chunk after `StreamEnding` has seen it: the first
    token-carrying chunk is the TTFT (a chat stream's role chunk carries none), every later chunk
    but the `[DONE]` terminator and a usage-only one (`"choices":[]`) an inter-token gap. A chunk
    holding several events counts as one gap: the router sees chunks, not tokens."""

    __slots__ = ("_dispatched", "_gaps", "_routable_from", "_token_at", "_traffic")

    def __init__(self, traffic: EndpointTraffic, dispatched: float, routable_from: float) -> None:
        self._traffic = traffic
        self._gaps = traffic.itl.observe  # bound once: this runs on every chunk
        self._dispatched = dispatched
        self._routable_from = routable_from
        self._token_at: float | None = None

    def feed(self, chunk: bytes, tokens_emitted: bool) -> None:
        last = self._token_at
        if last is None:
            if tokens_emitted:
                self._token_at = now = time.monotonic()
                self._traffic.first_token(now - self._dispatched, self._dispatched, self._routable_from)
            return
        if chunk.startswith(b"data: [DONE]") or b'"choices":[]' in chunk:
            return
        self._token_at = now = time.monotonic()
        self._gaps(now - last)
