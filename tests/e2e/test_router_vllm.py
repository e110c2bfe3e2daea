"""`corral router` in front of a real vLLM CPU engine: what a client gets through the router is what the
engine said, whatever the client's HTTP habits.

The same request goes to the engine directly and through the router, with the same `x-request-id`, so
the engine names both answers alike (`chatcmpl-<id>` / `cmpl-<id>`); the one field normalised before the
byte comparison is `created`, a wall-clock second. Requests sent the way curl sends a large body
(`Expect: 100-continue`, the body only after `100 Continue`) go over raw sockets, so the test sees every
status line the router writes, interim ones included.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit
from uuid import uuid4

import aiohttp
import orjson
import pytest

from tests.e2e.conftest import SERVED_NAME
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until

pytestmark = pytest.mark.e2e

CREATED = re.compile(rb'"created":\d+')


@contextmanager
def router_in_front(engine: str, *extra: str) -> Iterator[str]:
    """`corral router --backend <engine> [extra...]` as a real process, routable once it has read the
    engine's models."""
    port = free_port()
    proc = CorralProcess(
        ["router", "--host", "127.0.0.1", "--port", str(port), "--backend", engine,
         "--models-refresh-seconds", "0.5", *extra]
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(url + "/health", timeout=30)
        wait_until(lambda: SERVED_NAME in models(url), 30, f"the router to list `{SERVED_NAME}`")
        yield url
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def router(vllm_engine: str) -> Iterator[str]:
    with router_in_front(vllm_engine) as url:
        yield url


def models(url: str) -> list[str]:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=2) as resp:
            return [m["id"] for m in orjson.loads(resp.read())["data"]]
    except OSError:
        return []


def normalise_created(body: bytes) -> bytes:
    return CREATED.sub(b'"created":0', body)


async def post(url: str, path: str, body: bytes | dict[str, Any], request_id: str) -> tuple[int, str, bytes]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = {"content-type": "application/json", "x-request-id": request_id}
    timeout = aiohttp.ClientTimeout(total=60)
    async with (
        aiohttp.ClientSession(timeout=timeout) as s,
        s.post(url + path, data=data, headers=headers) as r,
    ):
        return r.status, r.headers.get("content-type", ""), await r.read()


# -- one HTTP/1.1 exchange over a raw socket, sent the way curl sends a large body ---------------


@dataclass
class Exchange:
    interim: list[int] = field(default_factory=list)  # 1xx status codes the client was sent
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


async def read_answer(reader: asyncio.StreamReader, got: Exchange) -> None:
    """Status lines until a final one (recording each 1xx), then its headers and its whole body."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        if 100 <= status < 200:
            got.interim.append(status)
            continue
        got.status = status
        got.headers = {
            k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
        }
        break
    if "content-length" in got.headers:
        got.body = await reader.readexactly(int(got.headers["content-length"]))
    elif got.headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
            pass
        got.body = b"".join(parts)
    else:
        got.body = await reader.read()


async def post_like_curl(
    url: str, path: str, body: bytes, request_id: str, answer_within: float = 30
) -> Exchange:
    """POST with `Expect: 100-continue`: headers first, the body after `100 Continue` (or after 1 s without
    one, as curl does), then read every answer until the final one."""
    where = urlsplit(url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port, limit=1 << 22)
    got = Exchange()
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {where.netloc}\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n"
            f"Content-Type: application/json\r\nx-request-id: {request_id}\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        await writer.drain()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1.0)
        except TimeoutError:
            head = b""
        if head:
            status = int(head.split()[1])
            assert status == 100, f"{request_id}: answered {head!r} before the body was sent"
            got.interim.append(status)
        writer.write(body)
        await writer.drain()
        try:
            await asyncio.wait_for(read_answer(reader, got), answer_within)
        except (TimeoutError, asyncio.IncompleteReadError) as exc:
            raise AssertionError(f"{request_id}: no final answer, only {got} ({type(exc).__name__})") from exc
        return got
    finally:
        writer.close()


# -- the engine's bytes, through the router ------------------------------------------------------

CHAT = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "tell me about the sea"}]}
COMPLETION = {"model": SERVED_NAME, "prompt": "once upon a time"}
USAGE = {"stream_options": {"include_usage": True}}

SAME_BYTES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {**CHAT, "max_tokens": 8}),
    "chat stream": ("/v1/chat/completions", {**CHAT, "max_tokens": 8, "stream": True}),
    "chat stream with usage": ("/v1/chat/completions", {**CHAT, "max_tokens": 8, "stream": True, **USAGE}),
    "completion": ("/v1/completions", {**COMPLETION, "max_tokens": 8}),
    "completion stream with usage": (
        "/v1/completions",
        {**COMPLETION, "max_tokens": 8, "stream": True, **USAGE},
    ),
}


@pytest.mark.parametrize("name", list(SAME_BYTES))
async def test_answers_through_the_router_are_the_engines_bytes(
    vllm_engine: str, router: str, name: str
) -> None:
    """Byte for byte, `created` aside. vLLM merges a stream's pending deltas into one event when its own
    server falls behind, so on a busy machine the same tokens can come cut into other events: such a pair
    must still carry the same text, and is asked again until one pair is cut alike (at most 5 tries)."""
    path, payload = SAME_BYTES[name]
    payload = {**payload, "temperature": 0, "seed": 7, "ignore_eos": True}
    for _ in range(5):
        request_id = f"same-bytes-{uuid4().hex}"
        direct = await post(vllm_engine, path, payload, request_id)
        routed = await post(router, path, payload, request_id)
        assert direct[:2] == routed[:2]
        assert direct[0] == 200, direct
        if not payload.get("stream") or normalise_created(routed[2]) == normalise_created(direct[2]):
            assert normalise_created(routed[2]) == normalise_created(direct[2])
            return
        assert streamed_text(routed[2]) == streamed_text(direct[2])
    pytest.fail("the engine cut the same stream into other events 5 times in a row")


def streamed_text(body: bytes) -> str:
    """Every choice's text (completions) or content (chat) in a stream, joined: what event cuts keep."""
    assert body.endswith(b"data: [DONE]\n\n"), body[-80:]
    text = []
    for event in body.split(b"\n\n")[:-2]:
        for choice in orjson.loads(event.removeprefix(b"data: "))["choices"]:
            text.append(choice.get("text") or choice.get("delta", {}).get("content") or "")
    return "".join(text)


# -- the engine's own errors, through the router -------------------------------------------------

ENGINE_ERRORS: dict[str, tuple[str, dict[str, Any]]] = {
    "max_tokens too large": ("/v1/completions", {**COMPLETION, "max_tokens": 100000}),
    "prompt too long (characters)": ("/v1/completions", {**COMPLETION, "prompt": "hello " * 600}),
    "prompt too long (tokens)": ("/v1/completions", {**COMPLETION, "prompt": "~" * 1400}),
    "stream_options without stream": ("/v1/chat/completions", {**CHAT, **USAGE}),
    "missing messages": ("/v1/chat/completions", {"model": SERVED_NAME}),
}


@pytest.mark.parametrize("name", list(ENGINE_ERRORS))
async def test_the_engines_errors_pass_through_unchanged(vllm_engine: str, router: str, name: str) -> None:
    path, payload = ENGINE_ERRORS[name]
    request_id = f"engine-error-{uuid4().hex}"
    direct = await post(vllm_engine, path, payload, request_id)
    routed = await post(router, path, payload, request_id)
    assert direct[0] in (400, 404), direct
    assert routed == direct


async def test_an_unknown_model_gets_the_engines_error_shape(vllm_engine: str, router: str) -> None:
    """The router answers this one itself (it knows which models its fleet serves, and forwards nothing);
    status, type, param and code are the engine's, the message names no alias list."""
    payload = {**CHAT, "model": "nope"}
    direct = await post(vllm_engine, "/v1/chat/completions", payload, "unknown-model")
    routed = await post(router, "/v1/chat/completions", payload, "unknown-model")
    assert (routed[0], routed[1]) == (direct[0], direct[1]) == (404, "application/json")
    want, got = orjson.loads(direct[2])["error"], orjson.loads(routed[2])["error"]
    assert [got[k] for k in ("type", "param", "code")] == [want[k] for k in ("type", "param", "code")]
    assert "`nope`" in got["message"]


# -- Expect: 100-continue ------------------------------------------------------------------------


async def test_a_large_prompt_sent_like_curl_gets_the_engines_final_answer(
    vllm_engine: str, router: str
) -> None:
    """1.2 MB of prompt: more than curl's 1 MiB threshold for `Expect: 100-continue`. The engine refuses it
    (prompt too long); the client must get that refusal, not a bare `100 Continue`."""
    body = orjson.dumps({**COMPLETION, "prompt": "x" * 1_200_000, "max_tokens": 4})
    assert len(body) > 1_200_000
    direct = await post_like_curl(vllm_engine, "/v1/completions", body, "curl-direct")
    routed = await post_like_curl(router, "/v1/completions", body, "curl-direct")
    assert direct.status == 400, direct
    assert routed.interim in ([], [100]), routed
    assert (routed.status, routed.headers["content-type"]) == (direct.status, direct.headers["content-type"])
    assert routed.body == direct.body
    assert b"1200000 characters" in routed.body


@dataclass(frozen=True)
class Ask:
    """One client's request: its own request id (the engine answers `cmpl-<id>`) and its own max_tokens
    (with ignore_eos, the engine's `completion_tokens`)."""

    request_id: str
    max_tokens: int
    expect: bool

    def body(self) -> bytes:
        return orjson.dumps(
            {**COMPLETION, "max_tokens": self.max_tokens, "temperature": 0, "ignore_eos": True}
        )

    def wrong(self, status: int, body: bytes) -> str | None:
        """Why this answer is not this client's, or None when it is."""
        if status != 200:
            return f"{self.request_id}: status {status} {body[:200]!r}"
        answer = orjson.loads(body)
        got = (answer["id"], answer["usage"]["completion_tokens"])
        if got != (f"cmpl-{self.request_id}", self.max_tokens):
            return f"{self.request_id} (max_tokens {self.max_tokens}) got the answer to {got}"
        return None


async def test_expect_interleaved_with_ordinary_requests_every_client_gets_its_own_answer(
    router: str,
) -> None:
    """Rounds of one slow `Expect: 100-continue` client followed by two ordinary keep-alive clients: each
    answer must name the request id and carry the token count of the client that asked."""
    rounds = 9
    asks = []
    for r in range(rounds):
        asks.append(Ask(f"expect-{r}-{uuid4().hex[:8]}", 24 + r, expect=True))
        asks += [Ask(f"plain-{r}-{i}-{uuid4().hex[:8]}", 1 + (2 * r + i) % 6, expect=False) for i in range(2)]
    timeout = aiohttp.ClientTimeout(total=120)

    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(ask: Ask) -> str | None:
            if ask.expect:
                got = await post_like_curl(
                    router, "/v1/completions", ask.body(), ask.request_id, answer_within=60
                )
                return ask.wrong(got.status, got.body)
            headers = {"content-type": "application/json", "x-request-id": ask.request_id}
            async with session.post(router + "/v1/completions", data=ask.body(), headers=headers) as resp:
                return ask.wrong(resp.status, await resp.read())

        tasks = []
        for ask in asks:
            tasks.append(asyncio.create_task(one(ask)))
            await asyncio.sleep(0.02)  # interleave: each request starts while the ones before are in flight
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)

    wrong = [repr(o) if isinstance(o, BaseException) else o for o in outcomes if o is not None]
    print(
        f"{len(asks)} requests ({rounds} with Expect: 100-continue), "
        f"{len(wrong)} not answered to the client that asked"
    )
    assert wrong == [], "\n".join(wrong)


# -- a client that hangs up ----------------------------------------------------------------------


async def engine_metric(engine: str, name: str, **labels: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(engine + "/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in the engine's /metrics")


async def engine_idle_counts(engine: str) -> tuple[float, float]:
    """(requests finished for `length`, tokens generated) once the engine runs nothing and both counts hold
    still across two reads: a finished request's counts land just after its answer has left."""
    last = None
    async with asyncio.timeout(60):  # bounded: even a request the engine never aborts ends at max_tokens
        while True:
            running = await engine_metric(engine, "vllm:num_requests_running")
            counts = (
                await engine_metric(engine, "vllm:request_success_total", finished_reason="length"),
                await engine_metric(engine, "vllm:generation_tokens_total"),
            )
            if running == 0 and counts == last:
                return counts
            last = counts
            await asyncio.sleep(0.2)


async def test_a_client_gone_mid_stream_makes_the_engine_abort_its_request(
    vllm_engine: str, router: str
) -> None:
    """The client hangs up after the first event of a long stream; the engine must stop generating: its
    `vllm:num_requests_running` falls back to 0 with fewer tokens generated than asked and no request
    finished for `length` (vLLM 0.32 does not count a client's abort under `finished_reason="abort"`).
    With 20 logprobs per token the stream takes about a second on this tiny model, so the hang-up lands
    while the engine is still generating."""
    max_tokens = 230
    finished_before, generated_before = await engine_idle_counts(vllm_engine)
    payload = {**COMPLETION, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
               "logprobs": 20}  # fmt: skip
    where = urlsplit(router)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    body = orjson.dumps(payload)
    writer.write(
        f"POST /v1/completions HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
    assert head.startswith(b"HTTP/1.1 200"), head
    await asyncio.wait_for(reader.readuntil(b"\n\n"), 60)  # the first event: the stream has begun
    assert await engine_metric(vllm_engine, "vllm:num_requests_running") == 1, "the stream ended too soon"
    writer.transport.abort()  # hang up mid-stream, as a client that crashed would

    finished, generated = await engine_idle_counts(vllm_engine)
    generated -= generated_before
    assert (finished, generated < max_tokens) == (finished_before, True), (
        f"the engine ran the stream to its end: {generated} tokens generated, {max_tokens} asked"
    )
