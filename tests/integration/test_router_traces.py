"""The router's traces, against a real router process, an engine that records what it is sent
(tests/support/recording_engine.py) and a receiver of Corral's OTLP/HTTP JSON in the test: a client's
`traceparent` makes the router's span its child, the engine is sent the router's own `traceparent` (its
attempt span), never the client's; hostile trace headers are ignored and the request is served; a
collector that went away costs the requests nothing. The real vLLM engine's spans joining the trace:
tests/e2e/test_tracing_vllm.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

import orjson
import pytest

from tests.support import recording_engine
from tests.support.procs import CorralProcess, free_port
from tests.support.span_sink import SpanSink, attribute, span_sink
from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
MODEL = recording_engine.MODEL
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@dataclass(frozen=True)
class Traced:
    router: str
    engine: str
    sink: SpanSink
    proc: CorralProcess

    def post(self, headers: dict[str, str]) -> int:
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
        request = Request(
            self.router + "/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json", **headers},
        )
        with urlopen(request, timeout=30) as answer:
            answer.read()
            return int(answer.status)

    def engine_saw(self) -> dict[str, Any]:
        """The one request the engine was sent since the last look: its headers, lower-cased names."""
        with urlopen(self.engine + "/_seen?reset=1", timeout=10) as answer:
            seen = orjson.loads(answer.read())
        assert len(seen) == 1, seen
        headers: dict[str, list[str]] = {}
        for name, value in seen[0]["headers"]:
            headers.setdefault(name.lower(), []).append(value)
        return headers

    def root_span(self, request_id: str) -> dict[str, Any]:
        wait_until(
            lambda: bool(self.sink.where("corral.request_id", request_id)), 15, f"span of {request_id}"
        )
        (span,) = self.sink.where("corral.request_id", request_id)
        return span


@pytest.fixture(scope="module", params=["lean", "aiohttp"])
def traced(request: pytest.FixtureRequest) -> Iterator[Traced]:
    """A traced router on each of the router's two HTTP front ends (corral.router.serving, aiohttp)."""
    engine, engine_url = recording_engine.start(ROOT)
    port = free_port()
    try:
        with span_sink() as sink:
            proc = CorralProcess(
                [
                    "router",
                    "--port",
                    str(port),
                    "--backend",
                    engine_url,
                    "--workers",
                    "1",
                    "--otlp-traces-endpoint",
                    sink.url,
                    "--http-server",
                    request.param,
                ],
                env={"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20sink-secret-7f3a"},
            )
            try:
                proc.wait_http(f"http://127.0.0.1:{port}/health")
                yield Traced(f"http://127.0.0.1:{port}", engine_url, sink, proc)
            finally:
                proc.stop()
    finally:
        recording_engine.stop(engine)


def test_the_engine_is_sent_the_routers_span_as_parent_in_the_clients_trace(traced: Traced) -> None:
    status = traced.post(
        {
            "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
            "tracestate": "vendor=abc,other=x",
            "X-Request-Id": "trace-req-1",
        }
    )
    assert status == 200
    sent = traced.engine_saw()
    assert len(sent["traceparent"]) == 1, sent["traceparent"]
    version, trace_id, parent_id, flags = sent["traceparent"][0].split("-")
    assert (version, trace_id, flags) == ("00", CLIENT_TRACE, "01")
    assert parent_id != CLIENT_SPAN  # the router's span, not the client's
    assert sent["tracestate"] == ["vendor=abc,other=x"]

    root = traced.root_span("trace-req-1")
    assert root["traceId"] == CLIENT_TRACE
    assert root["parentSpanId"] == CLIENT_SPAN
    assert root["name"] == f"chat {MODEL}"
    assert root["kind"] == 2  # SERVER
    assert attribute(root, "gen_ai.operation.name") == "chat"
    assert attribute(root, "gen_ai.request.model") == MODEL
    assert attribute(root, "corral.route.policy") == "round_robin"
    assert attribute(root, "corral.route.endpoint") == traced.engine
    assert attribute(root, "http.response.status_code") == "200"
    wait_until(lambda: bool(traced.sink.children_of(root)), 15, "the attempt span")
    (attempt,) = traced.sink.children_of(root)
    assert attempt["spanId"] == parent_id  # what the engine was told is its parent
    assert attempt["kind"] == 3  # CLIENT
    assert attribute(attempt, "corral.endpoint") == traced.engine
    # the exporter sent the configured header; the router's log never shows its value
    assert traced.sink.headers[0].get("Authorization") == "Bearer sink-secret-7f3a"
    assert "sink-secret-7f3a" not in traced.proc.output()


@pytest.mark.parametrize(
    "hostile",
    [
        {"traceparent": "00-" + "a" * 4_000 + "-00f067aa0ba902b7-01"},  # oversized
        {"traceparent": f"00-{'0' * 32}-{CLIENT_SPAN}-01"},  # all-zero trace id
        {"traceparent": f"00-{CLIENT_TRACE.upper()}-{CLIENT_SPAN}-01"},  # upper-case hex
        {"traceparent": f"ff-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},  # the forbidden version
        {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "tracestate": "k=" + "v" * 5_000},
        {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "tracestate": "BAD KEY=1,=2,k=v"},
    ],
    ids=["oversized", "zero-trace", "upper-hex", "version-ff", "huge-tracestate", "bad-tracestate"],
)
def test_hostile_trace_headers_are_ignored_and_the_request_served(
    traced: Traced, hostile: dict[str, str]
) -> None:
    status = traced.post(hostile)
    assert status == 200
    sent = traced.engine_saw()
    (traceparent,) = sent["traceparent"]
    version, trace_id, span_id, _ = traceparent.split("-")
    assert version == "00" and len(trace_id) == 32 and len(span_id) == 16
    if "tracestate" in hostile:  # the traceparent was good: the trace is the client's, its state dropped
        assert trace_id == CLIENT_TRACE
        assert "tracestate" not in sent
    else:  # a trace of the router's own
        assert trace_id not in (CLIENT_TRACE, "0" * 32, CLIENT_TRACE.upper())


def test_a_collector_gone_costs_the_requests_nothing() -> None:
    engine, engine_url = recording_engine.start(ROOT)
    closed = free_port()  # nothing listens there
    port = free_port()
    proc = CorralProcess(
        ["router", "--port", str(port), "--backend", engine_url, "--workers", "1"],
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed}"},
    )
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health")
        for _ in range(20):
            status = Traced(f"http://127.0.0.1:{port}", engine_url, SpanSink(), proc).post({})
            assert status == 200
        wait_until(lambda: "could not export" in proc.output(), 15, "the exporter's warning")
        assert Traced(f"http://127.0.0.1:{port}", engine_url, SpanSink(), proc).post({}) == 200
    finally:
        proc.stop()
        recording_engine.stop(engine)


def test_grpc_is_refused_saying_what_is_spoken() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "corral",
            "router",
            "--backend",
            "http://127.0.0.1:1",
            "--otlp-traces-endpoint",
            "http://x:4317",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317",
        },
    )
    assert result.returncode == 2
    assert "OTEL_EXPORTER_OTLP_PROTOCOL='grpc'" in result.stderr
    assert "http/json" in result.stderr
