"""A real OTLP/HTTP trace receiver for tests, run as its own process under a Python that has the
OpenTelemetry protobufs (`opentelemetry-proto`, in `.vllm-venv`; Corral's own environment cannot hold
them, see ARCHITECTURE): `POST /v1/traces` as `application/x-protobuf` (vLLM's exporter) or
`application/json` (Corral's, read with protobuf's own JSON parser into `ExportTraceServiceRequest`
after the one change OTLP makes to protobuf's JSON mapping: trace and span ids are hex, not base64, so
each is checked as exactly 32 or 16 hex digits and handed to the parser as the bytes it stands for; a
body that is not valid OTLP JSON is a 400 and recorded as rejected, never as spans). Each span
received becomes one JSON line in the output file: its ids (hex), parent, name, service, kind and
attributes, and the encoding it came in.

Run: PYTHON otlp_receiver.py OUT.jsonl; prints `port N` once listening on 127.0.0.1."""

from __future__ import annotations

import base64
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

MAX_BODY = 16 << 20
_ID_DIGITS = {"traceId": 32, "spanId": 16, "parentSpanId": 16}
_HEX = re.compile(r"[0-9a-f]*")


def hex_ids_to_base64(node: Any) -> Any:
    """The OTLP JSON document with every id (hex, as OTLP's JSON encoding writes them) in base64, as
    protobuf's JSON parser reads a bytes field; an id that is not lowercase hex of its length raises."""
    if isinstance(node, list):
        return [hex_ids_to_base64(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        digits = _ID_DIGITS.get(key)
        if digits is not None and isinstance(value, str):
            lengths = (digits, 0) if key == "parentSpanId" else (digits,)  # a root span: no parent
            if not _HEX.fullmatch(value) or len(value) not in lengths:
                raise ValueError(f"{key} {value!r} is not {digits} lowercase hex digits")
            value = base64.b64encode(bytes.fromhex(value)).decode("ascii")
        out[key] = hex_ids_to_base64(value)
    return out


_write = threading.Lock()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


def spans_of(request: ExportTraceServiceRequest, encoding: str) -> list[dict[str, Any]]:
    lines = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                lines.append(
                    {
                        "encoding": encoding,
                        "service": resource.get("service.name"),
                        "scope": scope_spans.scope.name,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": span.kind,
                        "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano,
                        "status": span.status.code,
                        "attributes": {a.key: _value(a.value) for a in span.attributes},
                        "events": [e.name for e in span.events],
                    }
                )
    return lines


class Receiver(BaseHTTPRequestHandler):
    out_path = ""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0")[:9] or 0)
        body = self.rfile.read(min(length, MAX_BODY))
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        request = ExportTraceServiceRequest()
        try:
            if self.path != "/v1/traces":
                raise ValueError(f"path {self.path}")
            if kind == "application/x-protobuf":
                request.ParseFromString(body)
                encoding = "protobuf"
            elif kind == "application/json":
                json_format.ParseDict(hex_ids_to_base64(json.loads(body)), request)
                encoding = "json"
            else:
                raise ValueError(f"content type {kind!r}")
        except Exception as exc:  # any bad body is the sender's bug: say so, keep it
            self._record({"rejected": f"{type(exc).__name__}: {exc}"[:2000], "content_type": kind})
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        for line in spans_of(request, encoding):
            self._record(line)
        answer = ExportTraceServiceResponse()
        payload = answer.SerializeToString() if encoding == "protobuf" else b"{}"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _record(self, line: dict[str, Any]) -> None:
        with _write, open(self.out_path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    Receiver.out_path = sys.argv[1]
    open(Receiver.out_path, "w").close()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
