"""Corral's OTLP JSON encoding of finished spans, field by field as the OTLP spec's JSON mapping writes
them (the e2e receiver parses the same bodies with the OTLP protobufs: tests/e2e/test_tracing_vllm.py)."""

from __future__ import annotations

import math

import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

from corral.tracing.otlp_json import any_value, encode_spans, export_request


def _spans() -> tuple[list[ReadableSpan], InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "corral-test"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("corral.router", "9.9")
    other = provider.get_tracer("corral.supervisor")
    root = tracer.start_span("chat m", kind=SpanKind.SERVER, attributes={"n": 7, "ok": True})
    child = tracer.start_span("attempt 0", context=set_span_in_context(root), kind=SpanKind.CLIENT)
    child.add_event("first byte", {"corral.seconds": 0.25})
    child.set_status(Status(StatusCode.ERROR, "refused"))
    child.end()
    root.end()
    lone = other.start_span("op")
    lone.end()
    return list(memory.get_finished_spans()), memory


def test_the_request_is_resource_then_scope_then_spans_with_hex_ids_and_string_nanos() -> None:
    spans, _ = _spans()
    body = orjson.loads(encode_spans(spans))
    (resource,) = body["resourceSpans"]
    assert {"key": "service.name", "value": {"stringValue": "corral-test"}} in resource["resource"][
        "attributes"
    ]
    scopes = {scope["scope"]["name"]: scope for scope in resource["scopeSpans"]}
    assert scopes["corral.router"]["scope"]["version"] == "9.9"
    assert "version" not in scopes["corral.supervisor"]["scope"]
    child, root = scopes["corral.router"]["spans"]
    assert root["name"] == "chat m" and root["kind"] == 2 and child["kind"] == 3
    assert len(root["traceId"]) == 32 and len(root["spanId"]) == 16
    int(root["traceId"], 16), int(root["spanId"], 16)  # hex, not base64
    assert root["traceId"] == child["traceId"]
    assert child["parentSpanId"] == root["spanId"]
    assert "parentSpanId" not in root
    assert isinstance(root["startTimeUnixNano"], str) and int(root["endTimeUnixNano"]) >= int(
        root["startTimeUnixNano"]
    )
    assert root["attributes"] == [
        {"key": "n", "value": {"intValue": "7"}},
        {"key": "ok", "value": {"boolValue": True}},
    ]
    assert "status" not in root  # UNSET is the default, left out
    assert child["status"] == {"code": 2, "message": "refused"}
    (event,) = child["events"]
    assert event["name"] == "first byte" and isinstance(event["timeUnixNano"], str)
    assert event["attributes"] == [{"key": "corral.seconds", "value": {"doubleValue": 0.25}}]


def test_spans_of_two_resources_are_two_resource_spans() -> None:
    first, _ = _spans()
    second, _ = _spans()
    assert len(export_request([*first, *second])["resourceSpans"]) == 2


def test_every_attribute_type_is_an_any_value() -> None:
    assert any_value("x") == {"stringValue": "x"}
    assert any_value(False) == {"boolValue": False}  # a bool before an int
    assert any_value(2**62) == {"intValue": str(2**62)}
    assert any_value(1.5) == {"doubleValue": 1.5}
    assert any_value(math.nan) == {"doubleValue": "NaN"}
    assert any_value(-math.inf) == {"doubleValue": "-Infinity"}
    assert any_value(b"\x00\xff") == {"bytesValue": "AP8="}
    assert any_value(("a", 1)) == {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "1"}]}}
    orjson.dumps(any_value(math.inf))  # every value is valid JSON (orjson refuses NaN floats)
