"""An OTLP/HTTP JSON trace receiver inside the test process (a thread): what Corral's exporter POSTs to
`/v1/traces`, kept span by span as the JSON encoding writes them (hex ids, camelCase). For tests that
need no protobuf; `tests/support/otlp_receiver.py` is the one that parses with the OTLP protobufs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson


@dataclass
class SpanSink:
    url: str = ""
    spans: list[dict[str, Any]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # each export's request headers
    lock: threading.Lock = field(default_factory=threading.Lock)

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [span for span in self.spans if span["name"] == name]

    def where(self, key: str, value: Any) -> list[dict[str, Any]]:
        """Spans with the attribute `key` of `value` (compared as the JSON encoding writes it)."""
        with self.lock:
            return [span for span in self.spans if attribute(span, key) == value]

    def children_of(self, span: dict[str, Any]) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s.get("parentSpanId") == span["spanId"]]


def attribute(span: dict[str, Any], key: str) -> Any:
    """An attribute's value, unwrapped from its AnyValue (intValue stays the JSON's decimal string)."""
    for item in span.get("attributes", []):
        if item["key"] == key:
            return next(iter(item["value"].values()))
    return None


@contextmanager
def span_sink() -> Iterator[SpanSink]:
    sink = SpanSink()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = orjson.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            with sink.lock:
                sink.bodies.append(body)
                sink.headers.append(dict(self.headers.items()))
                for resource in body["resourceSpans"]:
                    for scope in resource["scopeSpans"]:
                        sink.spans.extend(scope["spans"])
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    sink.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()


def span_tree(spans: list[dict[str, Any]], keys: tuple[str, ...] = ()) -> str:
    """The spans as an indented tree, children in start order, each with its duration and `keys`'
    attributes: what docs/tracing.md shows."""
    ids = {span["spanId"] for span in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in sorted(spans, key=lambda s: int(s["startTimeUnixNano"])):
        parent = span.get("parentSpanId")
        children.setdefault(parent if parent in ids else None, []).append(span)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in children.get(parent, []):
            ms = (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e6
            shown = {key: attribute(span, key) for key in keys if attribute(span, key) is not None}
            error = " ERROR" if span.get("status", {}).get("code") == 2 else ""
            extra = " ".join(f"{k}={v}" for k, v in shown.items())
            lines.append(f"{'  ' * depth}{span['name']} ({ms:.1f} ms){error} {extra}".rstrip())
            walk(span["spanId"], depth + 1)

    walk(None, 0)
    return "\n".join(lines)
