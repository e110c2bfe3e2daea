"""Finished spans as an OTLP `ExportTraceServiceRequest` in the protocol's JSON encoding (the OTLP
spec's JSON mapping of the protobuf messages): `resourceSpans` → `scopeSpans` → `spans`, field names in
lowerCamelCase, trace and span ids as lowercase hex (not base64), 64-bit integers and times in
nanoseconds as decimal strings, enums as their numbers, attributes as `{key, value: AnyValue}`."""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

# proto SpanKind: 0 unspecified, then INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER
_KINDS = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


def encode_spans(spans: Sequence[ReadableSpan]) -> bytes:
    """The request body for `POST /v1/traces` with `Content-Type: application/json`."""
    return orjson.dumps(export_request(spans))


def export_request(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """Spans grouped by their resource, then by their instrumentation scope, in the order first seen."""
    by_resource: dict[int, tuple[Any, dict[tuple[str, str], list[ReadableSpan]]]] = {}
    for span in spans:
        resource = span.resource
        _, scopes = by_resource.setdefault(id(resource), (resource, {}))
        scope = span.instrumentation_scope
        key = (scope.name, scope.version or "") if scope is not None else ("", "")
        scopes.setdefault(key, []).append(span)
    resource_spans = []
    for resource, scopes in by_resource.values():
        scope_spans = []
        for (name, version), members in scopes.items():
            named: dict[str, Any] = {"name": name}
            if version:
                named["version"] = version
            scope_spans.append({"scope": named, "spans": [encode_span(span) for span in members]})
        resource_spans.append(
            {"resource": {"attributes": attributes(resource.attributes)}, "scopeSpans": scope_spans}
        )
    return {"resourceSpans": resource_spans}


def encode_span(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None  # an SDK span always has one
    out: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
        "name": span.name,
        "kind": _KINDS.get(span.kind, 0),
        "startTimeUnixNano": str(span.start_time or 0),
        "endTimeUnixNano": str(span.end_time or 0),
        "attributes": attributes(span.attributes),
    }
    state = context.trace_state.to_header() if context.trace_state else ""
    if state:
        out["traceState"] = state
    if span.parent is not None:
        out["parentSpanId"] = f"{span.parent.span_id:016x}"
    if span.events:
        out["events"] = [
            {
                "timeUnixNano": str(event.timestamp),
                "name": event.name,
                "attributes": attributes(event.attributes),
            }
            for event in span.events
        ]
    if span.links:
        out["links"] = [
            {
                "traceId": f"{link.context.trace_id:032x}",
                "spanId": f"{link.context.span_id:016x}",
                "attributes": attributes(link.attributes),
            }
            for link in span.links
        ]
    dropped = span.dropped_attributes
    if dropped:
        out["droppedAttributesCount"] = dropped
    status = span.status
    if status.status_code is not StatusCode.UNSET:
        out["status"] = {"code": _STATUS[status.status_code]}
        if status.description:
            out["status"]["message"] = status.description
    return out


def attributes(values: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    if not values:
        return []
    return [{"key": key, "value": any_value(value)} for key, value in values.items()]


def any_value(value: Any) -> dict[str, Any]:
    """An attribute's value as an OTLP AnyValue (bool before int: a bool is an int in Python)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"doubleValue": value}
        return {"doubleValue": "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [any_value(item) for item in value]}}
    return {"stringValue": str(value)}
