"""The router's span of one request, when tracing is configured (`--otlp-traces-endpoint`, OTEL_*): a
SERVER span for the client's request, a child per prefill leg and per attempt on an engine (CLIENT spans:
a retry is a second attempt), and the `traceparent` each attempt sends on, so the engine's own spans
(vLLM's `--otlp-traces-endpoint`) are children of the router's. Attributes follow the OpenTelemetry GenAI
conventions where they fit (`gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.*`) and
`corral.*` for the routing: policy, chosen endpoint, candidates, the prefill tokens the pick priced, the
wait before the first pick, retries. An incoming `traceparent` (bounded: corral.tracing.w3c) makes the
router's span its child; the client's trace headers are not sent on, the router's replace them."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from corral.tracing.w3c import parent_of, propagation_headers, remote_context

if TYPE_CHECKING:
    from corral.router.membership.endpoint import Endpoint
    from corral.router.routing.request import RouteRequest

# gen_ai.operation.name by the OpenAI path the request names
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "chat",
}
_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
# an answer's usage, digits bounded (never int() of an unbounded run)
_INPUT = re.compile(rb'"prompt_tokens":\s*(\d{1,12})(?!\d)')
_OUTPUT = re.compile(rb'"completion_tokens":\s*(\d{1,12})(?!\d)')
_FINISH = re.compile(rb'"finish_reason":\s*"([a-z_]{1,32})"')


class RequestTracer:
    """Starts one `RequestTrace` per request the proxy handles."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def begin(self, method: str, path: str, headers: Mapping[str, str]) -> RequestTrace:
        operation = OPERATIONS.get(path, "")
        parent = parent_of(headers.get("traceparent"), headers.get("tracestate"))
        span = self._tracer.start_span(
            operation or f"{method} {path[:64]}",
            context=remote_context(parent),
            kind=SpanKind.SERVER,
            attributes={
                "gen_ai.operation.name": operation or "other",
                "http.request.method": method,
                "url.path": path[:256],
            },
        )
        return RequestTrace(self._tracer, span, operation)


class RequestTrace:
    """One request's spans. The proxy reports to it; `end` closes whatever is still open."""

    __slots__ = ("_attempt", "_operation", "_prefill", "_started", "_tracer", "attempts", "span")

    def __init__(self, tracer: Tracer, span: Span, operation: str) -> None:
        self._tracer = tracer
        self._operation = operation
        self.span = span
        self._started = time.monotonic()
        self._attempt: Span | None = None
        self._prefill: Span | None = None
        self.attempts = 0

    def named(self, model: str, request_id: str) -> None:
        """The request's model and id are known: `{operation} {model}`, as GenAI spans are named."""
        span = self.span
        span.set_attribute("gen_ai.request.model", model)
        span.set_attribute("corral.request_id", request_id)
        if self._operation:
            span.update_name(f"{self._operation} {model}")

    def prefill_leg(self, headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """A P/D prefill leg starts (every prefill attempt within it): its span, and the headers that
        make the prefill engine's spans its children."""
        self._prefill = span = self._child("prefill", {"corral.pd.leg": "prefill"})
        return _with_context(headers, span)

    def prefill_done(self, endpoint: Endpoint | None, outcome: str) -> None:
        span = self._prefill
        if span is None:
            return
        if endpoint is not None:
            _endpoint_attributes(span, endpoint)
        span.set_attribute("corral.pd.outcome", outcome)
        if outcome != "answered":
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()
        self._prefill = None

    def attempt(
        self,
        endpoint: Endpoint,
        policy: str,
        candidates: int,
        route: RouteRequest,
        headers: Sequence[tuple[str, str]],
        decode_of: Endpoint | None = None,
    ) -> list[tuple[str, str]]:
        """An attempt goes to `endpoint` as `policy` picked it among `candidates` for `route`: its span,
        and the headers to send (the client's trace headers replaced by this attempt's). Why that
        engine, as far as the pick says: the uncached prompt tokens it priced there, and the share of the
        prompt it expected that engine's prefix cache to hold."""
        self._close_attempt(None)
        attempt = self.attempts
        self.attempts += 1
        if attempt == 0:
            self.span.set_attribute("corral.wait_seconds", round(time.monotonic() - self._started, 6))
        attributes: dict[str, str | int | float] = {
            "corral.attempt": attempt,
            "corral.route.policy": policy,
            "corral.route.candidates": candidates,
        }
        if route.prefill_tokens:
            attributes["corral.route.prefill_tokens"] = route.prefill_tokens
        share = getattr(route.expected_hit, "share", None)  # cache_feedback.ExpectedHit
        if isinstance(share, float):
            attributes["corral.route.expected_cached_share"] = round(share, 3)
        if decode_of is not None:
            attributes["corral.pd.leg"] = "decode"
            attributes["corral.pd.prefill_endpoint"] = decode_of.url
        span = self._child(f"attempt {attempt}", attributes)
        _endpoint_attributes(span, endpoint)
        self._attempt = span
        root = self.span
        root.set_attribute("corral.route.policy", policy)
        root.set_attribute("corral.route.endpoint", endpoint.url)
        root.set_attribute("corral.retries", attempt)
        return _with_context(headers, span)

    def attempt_failed(self, why: str) -> None:
        self._close_attempt(why)

    def answered(self, status: int, first_byte_seconds: float) -> None:
        """The engine answered the current attempt (`status`), its first byte after the time given."""
        span = self._attempt
        if span is None:
            return
        span.set_attribute("http.response.status_code", status)
        span.add_event("first byte", {"corral.seconds": round(first_byte_seconds, 6)})
        ttft = round(time.monotonic() - self._started, 6)
        self.span.set_attribute("gen_ai.server.time_to_first_token", ttft)

    def usage(self, answer: bytes) -> None:
        """Token counts and the finish reason from an answer's bytes (a whole body or a stream's last
        events), when the engine sent them."""
        span = self.span
        found = _INPUT.search(answer)
        if found is not None:
            span.set_attribute("gen_ai.usage.input_tokens", int(found.group(1)))
        found = _OUTPUT.search(answer)
        if found is not None:
            span.set_attribute("gen_ai.usage.output_tokens", int(found.group(1)))
        found = _FINISH.search(answer)
        if found is not None:
            span.set_attribute("gen_ai.response.finish_reasons", (found.group(1).decode("ascii"),))

    def end(self, status: int, failure: str | None = None) -> None:
        """The request ended with `status` to the client (`failure`: how a stream ended badly)."""
        self._close_attempt(failure if failure is not None or status < 500 else f"answered {status}")
        if self._prefill is not None:
            self.prefill_done(None, "abandoned")
        span = self.span
        span.set_attribute("http.response.status_code", status)
        if status >= 500 or failure is not None:
            span.set_status(Status(StatusCode.ERROR, failure or f"answered {status}"))
        span.end()

    def _child(self, name: str, attributes: Mapping[str, str | int | float]) -> Span:
        return self._tracer.start_span(
            name, context=set_span_in_context(self.span), kind=SpanKind.CLIENT, attributes=attributes
        )

    def _close_attempt(self, why: str | None) -> None:
        span = self._attempt
        if span is None:
            return
        if why is not None:
            span.set_status(Status(StatusCode.ERROR, why[:512]))
        span.end()
        self._attempt = None


def _endpoint_attributes(span: Span, endpoint: Endpoint) -> None:
    parts = urlsplit(endpoint.url)
    span.set_attribute("corral.endpoint", endpoint.url)
    if parts.hostname:
        span.set_attribute("server.address", parts.hostname)
    if parts.port:
        span.set_attribute("server.port", parts.port)


def _with_context(headers: Sequence[tuple[str, str]], span: Span) -> list[tuple[str, str]]:
    sent = [(name, value) for name, value in headers if name.lower() not in _TRACE_HEADERS]
    sent.extend(propagation_headers(span.get_span_context()))
    return sent
