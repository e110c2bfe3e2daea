"""One trace across the router and the real vLLM CPU engine: `corral router --otlp-traces-endpoint` in
front of the shared engine (which exports its own spans with `--otlp-traces-endpoint`), both to a real
OTLP/HTTP receiver that parses every body with the OTLP protobufs (tests/support/otlp_receiver.py):
Corral's as JSON (so each body is valid OTLP JSON), vLLM's as protobuf. A request carrying a client's
`traceparent` ends as one trace: the client's span → the router's request span → its attempt span →
vLLM's `llm_request`, parent by parent."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.e2e.conftest import SERVED_NAME, OtlpReceiver
from tests.e2e.test_router_vllm import router_in_front
from tests.support.waits import wait_until

pytestmark = pytest.mark.e2e

CLIENT_TRACE = "5d41402abc4b2a76b9719d911017c592"
CLIENT_SPAN = "7d793037a0760186"


@pytest.fixture(scope="module")
def traced_router(vllm_engine: str, otlp_receiver: OtlpReceiver) -> Iterator[str]:
    extra = ("--workers", "1", "--otlp-traces-endpoint", otlp_receiver.url)
    with router_in_front(vllm_engine, *extra) as url:
        yield url


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> bytes:
    request = urllib.request.Request(
        url, data=orjson.dumps(body), headers={"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        assert answer.status == 200
        return bytes(answer.read())


def test_one_trace_holds_the_routers_spans_and_the_engines(
    traced_router: str, otlp_receiver: OtlpReceiver
) -> None:
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
    _post(
        traced_router + "/v1/chat/completions",
        body,
        {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "X-Request-Id": "otel-e2e-1"},
    )

    def trace() -> list[dict[str, Any]]:
        return [line for line in otlp_receiver.lines() if line.get("trace_id") == CLIENT_TRACE]

    def complete() -> bool:
        spans = trace()
        router = any(s["service"] == "corral-router" and s["parent_span_id"] == CLIENT_SPAN for s in spans)
        return router and any(s["name"] == "llm_request" for s in spans)

    wait_until(complete, 60, "the router's and the engine's spans at the receiver")
    rejected = [line for line in otlp_receiver.lines() if "rejected" in line]
    assert rejected == [], rejected  # every body Corral (and vLLM) sent was valid OTLP
    spans = trace()
    for span in spans:
        print("span:", orjson.dumps(span).decode())
    (request,) = [s for s in spans if s["service"] == "corral-router" and s["parent_span_id"] == CLIENT_SPAN]
    assert request["encoding"] == "json"  # Corral's own exporter
    assert request["name"] == f"chat {SERVED_NAME}"
    assert request["attributes"]["gen_ai.request.model"] == SERVED_NAME
    assert request["attributes"]["gen_ai.usage.output_tokens"] == 8
    (attempt,) = [s for s in spans if s["parent_span_id"] == request["span_id"]]
    assert attempt["name"] == "attempt 0" and attempt["service"] == "corral-router"
    engine = [s for s in spans if s["parent_span_id"] == attempt["span_id"]]
    assert engine, spans  # vLLM's span is the attempt's child
    (llm,) = engine
    assert llm["encoding"] == "protobuf" and llm["service"] == "vllm"
    assert llm["name"] == "llm_request"
    assert llm["attributes"].get("gen_ai.request.id", "").endswith("otel-e2e-1")
