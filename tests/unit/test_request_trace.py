"""The router's spans of one request, as the proxy reports to them: a retry is a second attempt (the
first an error with its reason), a P/D prefill leg a span of its own before the decode attempt, usage
read from the answer within its digit bounds, and every span ended however the request ends."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.request import RouteRequest
from corral.router.telemetry.request_trace import RequestTrace, RequestTracer

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _tracer() -> tuple[RequestTracer, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return RequestTracer(provider.get_tracer("corral.router")), memory


def _endpoint(i: int) -> Endpoint:
    return Endpoint(f"http://10.0.0.{i}:8000", frozenset({"m"}), EngineState.READY)


class _Hit:
    """What a prefix pick leaves on the request (cache_feedback.ExpectedHit): the share it expected cached."""

    def __init__(self, share: float) -> None:
        self.share = share

    def answered(self, body: bytes) -> None:
        pass


def _begin(tracer: RequestTracer, headers: dict[str, str] | None = None) -> RequestTrace:
    trace = tracer.begin("POST", "/v1/chat/completions", headers or {})
    trace.named("m", "req-1")
    return trace


def _by_name(memory: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in memory.get_finished_spans()}


def test_a_retry_is_a_second_attempt_and_each_sends_its_own_traceparent() -> None:
    tracer, memory = _tracer()
    trace = _begin(tracer, {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01", "tracestate": "v=1"})
    client = [("X-Request-Id", "req-1"), ("traceparent", "00-ffff-bad-01"), ("TraceState", "v=1")]
    first = trace.attempt(_endpoint(1), "round_robin", 2, RouteRequest("m", {}), client)
    trace.attempt_failed("connection refused")
    priced = RouteRequest("m", {}, prefill_tokens=40, expected_hit=_Hit(0.75))
    second = trace.attempt(_endpoint(2), "prefix", 1, priced, client)
    trace.answered(200, 0.01)
    trace.usage(b'{"usage":{"prompt_tokens":12,"completion_tokens":3},"choices":[{"finish_reason":"stop"}]}')
    trace.end(200)

    spans = _by_name(memory)
    root, a0, a1 = spans["chat m"], spans["attempt 0"], spans["attempt 1"]
    assert root.kind is SpanKind.SERVER and root.parent is not None and root.parent.is_remote
    assert f"{root.context.trace_id:032x}" == TRACE
    assert a0.parent is not None and a0.parent.span_id == root.context.span_id
    assert a0.status.status_code is StatusCode.ERROR and a0.status.description == "connection refused"
    assert a1.status.status_code is StatusCode.UNSET and a1.attributes["corral.route.prefill_tokens"] == 40
    assert a1.attributes["corral.route.expected_cached_share"] == 0.75  # why this engine: its cache
    assert "corral.route.expected_cached_share" not in a0.attributes
    assert root.attributes["corral.retries"] == 1
    assert root.attributes["corral.route.endpoint"] == "http://10.0.0.2:8000"
    assert (root.attributes["gen_ai.usage.input_tokens"], root.attributes["gen_ai.usage.output_tokens"]) == (
        12,
        3,
    )
    assert root.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    for sent, span in ((first, a0), (second, a1)):
        names = [name.lower() for name, _ in sent]
        assert names.count("traceparent") == 1 and names.count("tracestate") == 1  # the client's replaced
        assert dict(sent)["traceparent"] == f"00-{TRACE}-{span.context.span_id:016x}-01"
        assert ("X-Request-Id", "req-1") in sent


def test_a_prefill_leg_is_its_own_span_before_the_decode_attempt() -> None:
    tracer, memory = _tracer()
    trace = _begin(tracer)
    leg_headers = trace.prefill_leg([("X-Request-Id", "req-1")])
    prefill = _endpoint(1)
    trace.prefill_done(prefill, "answered")
    trace.attempt(_endpoint(2), "load", 1, RouteRequest("m", {}), [], decode_of=prefill)
    trace.end(200)
    spans = _by_name(memory)
    leg, decode = spans["prefill"], spans["attempt 0"]
    assert dict(leg_headers)["traceparent"].split("-")[2] == f"{leg.context.span_id:016x}"
    assert (
        leg.attributes["corral.endpoint"] == prefill.url and leg.attributes["corral.pd.outcome"] == "answered"
    )
    assert decode.attributes["corral.pd.leg"] == "decode"
    assert decode.attributes["corral.pd.prefill_endpoint"] == prefill.url
    assert leg.end_time is not None and decode.start_time is not None and leg.end_time <= decode.start_time


def test_every_span_ends_however_the_request_ends() -> None:
    tracer, memory = _tracer()
    trace = _begin(tracer)
    trace.prefill_leg([])
    trace.end(499)  # the client went away during the prefill leg
    spans = _by_name(memory)
    assert set(spans) == {"chat m", "prefill"}
    assert spans["prefill"].status.status_code is StatusCode.ERROR
    trace = _begin(tracer)
    trace.attempt(_endpoint(1), "round_robin", 1, RouteRequest("m", {}), [])
    trace.end(502, "stream ended: cut")
    (cut,) = [s for s in memory.get_finished_spans() if s.name == "attempt 0"]
    assert cut.status.status_code is StatusCode.ERROR


def test_usage_digits_are_bounded() -> None:
    tracer, memory = _tracer()
    trace = _begin(tracer)
    trace.usage(b'{"usage":{"prompt_tokens":' + b"9" * 5000 + b',"completion_tokens":7}}')
    trace.end(200)
    root = _by_name(memory)["chat m"]
    assert "gen_ai.usage.input_tokens" not in root.attributes
    assert root.attributes["gen_ai.usage.output_tokens"] == 7
