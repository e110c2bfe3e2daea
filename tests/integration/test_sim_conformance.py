"""The simulator answers like the real vLLM captures in `tests/data/vllm-samples` (vLLM CPU 0.32.0).

One simulator is started like the captured engine (`--model tiny --max-model-len 256`), every request carries
`x-request-id: sample-req-1`, and each answer is compared with its capture: status, content type, JSON key
order and value types (recursively), SSE framing and chunk shapes, error messages, metric names and labels.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from corral.engine import metric_names as vllm
from tests.support.procs import CorralProcess, start_sim

# In the repository, so a plain clone runs these checks rather than skipping them (provenance: its README.md)
SAMPLES = Path(__file__).resolve().parents[1] / "data" / "vllm-samples"
RID = "sample-req-1"


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    proc: CorralProcess
    proc, url = start_sim(None, "--max-model-len", "256", "--itl-ms", "0.5", model="tiny")
    try:
        yield url
    finally:
        proc.stop()


def sample(name: str) -> tuple[int, dict[str, str], bytes]:
    head = (SAMPLES / f"{name}.headers").read_text().splitlines()
    status = int(head[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
    return status, headers, (SAMPLES / f"{name}.body").read_bytes()


def shape(value: Any) -> Any:
    """Keys in order and value types, recursively; consecutive equal list items collapsed."""
    if isinstance(value, dict):
        return tuple((k, shape(v)) for k, v in value.items())
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            s = shape(item)
            if not out or out[-1] != s:
                out.append(s)
        return ("list", tuple(out))
    return "null" if value is None else type(value).__name__


def sse_events(body: bytes) -> list[bytes]:
    assert body.endswith(b"\n\n"), body[-40:]
    events = body[:-2].split(b"\n\n")
    assert all(e.startswith(b"data: ") for e in events), events
    assert events[-1] == b"data: [DONE]"
    return [e[len(b"data: ") :] for e in events]


def stream_shapes(body: bytes) -> list[Any]:
    shapes: list[Any] = []
    for event in sse_events(body)[:-1]:
        s = shape(orjson.loads(event))
        if not shapes or shapes[-1] != s:
            shapes.append(s)
    return shapes


async def call(
    url: str, method: str, path: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    data = raw if raw is not None else (orjson.dumps(body) if body is not None else None)
    headers = {"x-request-id": RID, "content-type": "application/json"}
    async with aiohttp.ClientSession() as s, s.request(method, url + path, data=data, headers=headers) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read()


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hello!"}], "temperature": 0}
COMPLETION = {"model": "tiny", "prompt": "Hello", "temperature": 0}

JSON_CASES = {
    "completion": ("POST", "/v1/completions", {**COMPLETION, "max_tokens": 5}),
    "chat": ("POST", "/v1/chat/completions", {**CHAT, "max_tokens": 4}),
    "models": ("GET", "/v1/models", None),
    "version": ("GET", "/version", None),
    "tokenize": ("POST", "/tokenize", {"model": "tiny", "prompt": "Hello world"}),
    "sleep_without_dev_mode": ("POST", "/sleep?level=1", None),
}


@pytest.mark.parametrize("name", sorted(JSON_CASES))
async def test_json_answers_have_the_captured_shape(sim: str, name: str) -> None:
    method, path, body = JSON_CASES[name]
    status, headers, got = await call(sim, method, path, body)
    want_status, want_headers, want = sample(name)
    assert status == want_status
    assert headers["content-type"] == want_headers["content-type"]
    assert shape(orjson.loads(got)) == shape(orjson.loads(want))


async def test_request_id_is_echoed_and_names_the_response(sim: str) -> None:
    _, headers, body = await call(sim, *JSON_CASES["chat"])
    assert headers["x-request-id"] == RID
    assert orjson.loads(body)["id"] == orjson.loads(sample("chat")[2])["id"] == f"chatcmpl-{RID}"
    _, _, body = await call(sim, *JSON_CASES["completion"])
    assert orjson.loads(body)["id"] == f"cmpl-{RID}"
    async with aiohttp.ClientSession() as s, s.get(sim + "/health") as r:
        assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])


async def test_health_is_200_with_empty_body(sim: str) -> None:
    status, _, body = await call(sim, "GET", "/health")
    assert (status, body) == (sample("health")[0], sample("health")[2]) == (200, b"")


STREAM_CASES = {
    "chat_stream": (
        "/v1/chat/completions",
        {**CHAT, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}},
    ),
    "chat_stream_nousage": ("/v1/chat/completions", {**CHAT, "max_tokens": 2, "stream": True}),
    "completion_stream": (
        "/v1/completions",
        {**COMPLETION, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}},
    ),
}


@pytest.mark.parametrize("name", sorted(STREAM_CASES))
async def test_streams_have_the_captured_framing_and_chunk_shapes(sim: str, name: str) -> None:
    path, body = STREAM_CASES[name]
    status, headers, got = await call(sim, "POST", path, body)
    want_status, want_headers, want = sample(name)
    assert status == want_status
    assert headers["content-type"] == want_headers["content-type"]
    assert headers["x-request-id"] == RID
    assert stream_shapes(got) == stream_shapes(want)
    events = [orjson.loads(e) for e in sse_events(got)[:-1]]
    assert {e["id"] for e in events} == {orjson.loads(sse_events(want)[0])["id"]}
    if name.startswith("chat"):
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    if "usage" in events[-1]:
        assert events[-1]["choices"] == []
        generated = len(events) - 1 - (1 if name.startswith("chat") else 0)
        assert events[-1]["usage"]["completion_tokens"] == generated


ERROR_CASES: dict[str, tuple[str, Any]] = {
    # name: (path, body or raw bytes); the messages must match the captures word for word
    "error_unknown_model": ("/v1/chat/completions", {**CHAT, "model": "nope"}),
    "error_prompt_too_long": ("/v1/completions", {**COMPLETION, "prompt": "x" * 1599}),
    "error_prompt_too_long_tokens": ("/v1/completions", {**COMPLETION, "prompt": " a" * 700}),
    "error_bad_json": ("/v1/chat/completions", b"{bad json"),
    "error_missing_messages": ("/v1/chat/completions", {"model": "tiny"}),
    "error_stream_options_without_stream": (
        "/v1/completions",
        {**COMPLETION, "stream_options": {"include_usage": True}},
    ),
    "error_max_tokens_too_large": ("/v1/completions", {**COMPLETION, "max_tokens": 100000}),
}


@pytest.mark.parametrize("name", sorted(ERROR_CASES))
async def test_errors_match_the_captures(sim: str, name: str) -> None:
    path, body = ERROR_CASES[name]
    if isinstance(body, bytes):
        status, headers, got = await call(sim, "POST", path, raw=body)
    else:
        status, headers, got = await call(sim, "POST", path, body)
    want_status, want_headers, want = sample(name)
    assert status == want_status
    assert headers["content-type"] == want_headers["content-type"]
    got_err, want_err = orjson.loads(got), orjson.loads(want)
    assert shape(got_err) == shape(want_err)
    for key in ("type", "param", "code"):
        assert got_err["error"][key] == want_err["error"][key]
    assert got_err["error"]["message"] == want_err["error"]["message"]


def _metric_index(text: str) -> dict[str, set[frozenset[str]]]:
    """Sample name -> label-name sets seen, for the vllm: samples."""
    index: dict[str, set[frozenset[str]]] = {}
    for line in text.splitlines():
        m = re.match(r"^(vllm:[a-zA-Z0-9_:]+)(\{([^}]*)\})? ", line)
        if m:
            labels = frozenset(re.findall(r'(\w+)="', m.group(3) or ""))
            index.setdefault(m.group(1), set()).add(labels)
    return index


REQUIRED_METRICS = list(vllm.ALWAYS_EXPOSED_SAMPLES)  # the names Corral reads, from its one table


async def test_metrics_have_vllm_names_labels_help_and_buckets(sim: str) -> None:
    await call(sim, *JSON_CASES["completion"])
    status, headers, got = await call(sim, "GET", "/metrics")
    want_status, want_headers, want = sample("metrics")
    assert status == want_status
    assert headers["content-type"] == want_headers["content-type"]
    ours, theirs = _metric_index(got.decode()), _metric_index(want.decode())
    for name in REQUIRED_METRICS:
        assert name in theirs, name
        assert ours.get(name) == theirs[name], name
    for line in want.decode().splitlines():
        if line.startswith("# HELP vllm:") and line.split()[2] in {
            n.rsplit("_bucket", 1)[0] for n in REQUIRED_METRICS
        }:
            assert line in got.decode(), line
    bucket_lines = [
        ln.split(" ")[0]
        for ln in want.decode().splitlines()
        if ln.startswith(
            (
                "vllm:time_to_first_token_seconds_bucket",
                "vllm:inter_token_latency_seconds_bucket",
                "vllm:e2e_request_latency_seconds_bucket",
            )
        )
    ]
    for series in bucket_lines:
        assert series in got.decode(), series
    awake = re.search(r'vllm:engine_sleep_state\{[^}]*sleep_state="awake"[^}]*\} (\S+)', got.decode())
    assert awake and float(awake.group(1)) == 1.0
