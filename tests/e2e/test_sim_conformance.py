"""Simulator fidelity: the same requests to `corral sim` and to a real vLLM CPU engine, compared on
status codes, JSON keys and value types, SSE framing, error type/param/code, and metric names+labels.

Generated text, token counts and timings differ by design (a random tiny model against a toy
tokenizer); every other difference is either fixed in the simulator or listed in ALLOWED with the
reason it cannot matter to Corral.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from corral.engine import metric_names as vllm
from tests.e2e.conftest import MAX_MODEL_LEN, SERVED_NAME
from tests.support.procs import CorralProcess, start_sim

pytestmark = pytest.mark.e2e

# path in the JSON shape -> why a difference there cannot matter
ALLOWED: dict[str, str] = {}


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    proc: CorralProcess
    proc, url = start_sim(None, "--max-model-len", str(MAX_MODEL_LEN), model=SERVED_NAME)
    try:
        yield url
    finally:
        proc.stop()


def shape(value: Any) -> Any:
    """The structure of a JSON value: dict keys (sorted), list element shapes, scalar type names."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return type(value).__name__


def diff_shapes(real: Any, sim: Any, path: str = "$") -> list[str]:
    if path in ALLOWED:
        return []
    if isinstance(real, dict) and isinstance(sim, dict):
        out = []
        for key in real.keys() | sim.keys():
            sub = f"{path}.{key}"
            if key not in sim:
                out.append(f"{sub}: missing in sim")
            elif key not in real:
                out.append(f"{sub}: extra in sim")
            else:
                out += diff_shapes(real[key], sim[key], sub)
        return out
    if isinstance(real, list) and isinstance(sim, list):
        if real and sim:
            return diff_shapes(real[0], sim[0], path + "[]")
        return []
    if real != sim:
        return [f"{path}: vLLM {real} vs sim {sim}"]
    return []


def sse_events(body: bytes) -> list[bytes]:
    assert body.endswith(b"data: [DONE]\n\n"), body[-80:]
    parts = body.split(b"\n\n")
    assert parts[-1] == b""
    events = parts[:-1]
    for e in events:
        assert e.startswith(b"data: "), e
    return [e[len(b"data: ") :] for e in events]


def normalise_message(message: str) -> str:
    return re.sub(r"\d+", "N", message)


CHAT = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "hello there"}]}
COMPLETION = {"model": SERVED_NAME, "prompt": "once upon a time"}

JSON_CASES: list[tuple[str, str, dict[str, Any] | bytes]] = [
    ("chat", "/v1/chat/completions", {**CHAT, "max_tokens": 4, "temperature": 0}),
    ("completion", "/v1/completions", {**COMPLETION, "max_tokens": 4, "temperature": 0}),
    ("unknown model", "/v1/chat/completions", {**CHAT, "model": "nope"}),
    # vLLM's character bound is max_model_len x the tokenizer's longest token (13 chars for the tiny
    # model's BPE, 6 for the simulator's tokenizer and for the captured sample): exceed both
    ("prompt too long (chars)", "/v1/completions", {**COMPLETION, "prompt": "hello " * 600}),
    ("prompt too long (tokens)", "/v1/completions", {**COMPLETION, "prompt": "~" * 1400}),
    ("max_tokens too large", "/v1/completions", {**COMPLETION, "max_tokens": 100000}),
    (
        "stream_options without stream",
        "/v1/chat/completions",
        {**CHAT, "stream_options": {"include_usage": True}},
    ),
    ("missing messages", "/v1/chat/completions", {"model": SERVED_NAME}),
    ("bad json", "/v1/chat/completions", b'{"model": "tiny", '),
    ("tokenize", "/tokenize", {"model": SERVED_NAME, "prompt": "hello world"}),
]


@pytest.mark.parametrize(("name", "path", "payload"), JSON_CASES, ids=[c[0] for c in JSON_CASES])
def test_json_answers_match(
    vllm_engine: str, sim_url: str, name: str, path: str, payload: dict[str, Any] | bytes
) -> None:
    body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    headers = {"content-type": "application/json", "x-request-id": "conf-1"}
    real = httpx.post(vllm_engine + path, content=body, headers=headers, timeout=60)
    sim = httpx.post(sim_url + path, content=body, headers=headers, timeout=60)
    assert sim.status_code == real.status_code, (name, real.text, sim.text)
    assert sim.headers["content-type"] == real.headers["content-type"]
    assert sim.headers.get("x-request-id") == real.headers.get("x-request-id")
    real_json, sim_json = real.json(), sim.json()
    assert diff_shapes(shape(real_json), shape(sim_json)) == []
    if "error" in real_json:
        r, s = real_json["error"], sim_json["error"]
        assert (s["type"], s["param"], s["code"]) == (r["type"], r["param"], r["code"])
        if name != "prompt too long (tokens)":  # the count differs: another tokenizer
            assert normalise_message(s["message"]) == normalise_message(r["message"])
    elif "id" in real_json:
        assert sim_json["id"] == real_json["id"]  # chatcmpl-<x-request-id> / cmpl-<x-request-id>


STREAM_CASES = [
    (
        "chat stream with usage",
        "/v1/chat/completions",
        {
            **CHAT,
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    ("chat stream", "/v1/chat/completions", {**CHAT, "max_tokens": 4, "temperature": 0, "stream": True}),
    (
        "completion stream with usage",
        "/v1/completions",
        {
            **COMPLETION,
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
]


@pytest.mark.parametrize(("name", "path", "payload"), STREAM_CASES, ids=[c[0] for c in STREAM_CASES])
def test_streams_match(vllm_engine: str, sim_url: str, name: str, path: str, payload: dict[str, Any]) -> None:
    headers = {"content-type": "application/json", "x-request-id": "conf-2"}
    real = httpx.post(vllm_engine + path, content=orjson.dumps(payload), headers=headers, timeout=60)
    sim = httpx.post(sim_url + path, content=orjson.dumps(payload), headers=headers, timeout=60)
    assert (sim.status_code, sim.headers["content-type"]) == (real.status_code, real.headers["content-type"])
    real_events = [orjson.loads(e) for e in sse_events(real.content)[:-1]]
    sim_events = [orjson.loads(e) for e in sse_events(sim.content)[:-1]]
    # first chunk, a middle chunk, the finishing chunk, and the usage chunk (when asked) share shapes
    assert diff_shapes(shape(real_events[0]), shape(sim_events[0])) == []
    assert diff_shapes(shape(real_events[-1]), shape(sim_events[-1])) == []
    finishing = [e for e in real_events if e["choices"] and e["choices"][0].get("finish_reason")]
    sim_finishing = [e for e in sim_events if e["choices"] and e["choices"][0].get("finish_reason")]
    assert len(finishing) == len(sim_finishing) == 1
    assert diff_shapes(shape(finishing[0]), shape(sim_finishing[0])) == []
    assert all(e["id"] == real_events[0]["id"] for e in real_events)
    assert all(e["id"] == real_events[0]["id"] for e in sim_events)
    if "stream_options" in payload:
        assert real_events[-1]["choices"] == [] == sim_events[-1]["choices"]


@pytest.mark.parametrize("path", ["/v1/models", "/version"])
def test_get_endpoints_match(vllm_engine: str, sim_url: str, path: str) -> None:
    real, sim = httpx.get(vllm_engine + path), httpx.get(sim_url + path)
    assert sim.status_code == real.status_code == 200
    assert diff_shapes(shape(real.json()), shape(sim.json())) == []


def test_health_matches(vllm_engine: str, sim_url: str) -> None:
    real, sim = httpx.get(vllm_engine + "/health"), httpx.get(sim_url + "/health")
    assert (sim.status_code, sim.content) == (real.status_code, real.content) == (200, b"")


METRICS = list(vllm.ALWAYS_EXPOSED_SAMPLES)  # the names Corral reads, from its one table


def metric_labels(text: str) -> dict[str, set[frozenset[str]]]:
    found: dict[str, set[frozenset[str]]] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s", line)
        if not m:
            continue
        labels = frozenset(re.findall(r'([a-zA-Z_]+)="', m.group(3) or ""))
        found.setdefault(m.group(1), set()).add(labels)
    return found


def test_metric_names_and_labels_match(vllm_engine: str, sim_url: str) -> None:
    real_text, sim_text = httpx.get(vllm_engine + "/metrics").text, httpx.get(sim_url + "/metrics").text
    real, sim = metric_labels(real_text), metric_labels(sim_text)
    for name in METRICS:
        assert name in real, f"{name} not in real vLLM metrics: update the list"
        assert name in sim, f"{name} missing from the simulator"
        assert sim[name] == real[name], (name, real[name], sim[name])
    real_types = set(re.findall(r"# TYPE (vllm:\S+) (\S+)", real_text))
    sim_types = set(re.findall(r"# TYPE (vllm:\S+) (\S+)", sim_text))
    for name in METRICS:
        base = re.sub(r"_(bucket|total)$", "", name)
        want = {t for t in real_types if t[0] in (base, name)}
        assert want <= sim_types, (name, want - sim_types)
