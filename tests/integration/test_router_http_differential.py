"""The router on the wire: every answer reaches the client that asked, and what a client sees through
the router is what the engine said.

A raw HTTP/1.1 engine (tests/support/nonce_engine.py, a process on loopback) echoes each request's
nonce and body digest, answers `100 Continue` to `Expect` as uvicorn does, and frames its answers
by content-length, chunked with trailers, close or SSE; `corral router` runs in front of it as a
process. The Hypothesis test sends the same generated batches of concurrent requests straight to
the engine and through the router and compares them; it prints how many it tried and how many went
to the wrong client.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import nonce_engine, raw_http
from tests.support.nonce_engine import MODEL
from tests.support.procs import CorralProcess, free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Wire:
    engine: str
    router: str


@pytest.fixture(scope="module")
def wire() -> Iterator[Wire]:
    engine, engine_url = nonce_engine.start(ROOT)
    port = free_port()
    router = CorralProcess(
        ["router", "--host", "127.0.0.1", "--port", str(port), "--backend", engine_url, "--max-retries", "0"]
    )
    router_url = f"http://127.0.0.1:{port}"
    try:
        router.wait_http(router_url + "/health")
        yield Wire(engine_url, router_url)
    finally:
        router.stop()
        nonce_engine.stop(engine)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=15)) as s:
        yield s


async def engine_seen(session: aiohttp.ClientSession, wire: Wire) -> list[dict[str, Any]]:
    """The requests the fake engine received since the last call (its `/_seen` record, then reset),
    less the router's `/v1/models` probes."""
    async with session.get(wire.engine + "/_seen?reset=1") as resp:
        seen: list[dict[str, Any]] = orjson.loads(await resp.read())
    return [s for s in seen if s.get("path") != "/v1/models"]


@dataclass(frozen=True)
class Ask:
    """One request: what to send and how the engine should answer it."""

    nonce: str
    body_bytes: int
    framing: str = "length"  # how the engine frames its answer: length | chunked | close | sse
    expect: bool = False  # send `Expect: 100-continue` and wait for the 100, as curl does
    chunked: bool = False  # send the request body chunked
    delay_ms: int = 0
    answer_bytes: int = 0
    interim: bool = False
    status: int = 200
    extra_headers: tuple[tuple[str, str], ...] = ()

    def body(self) -> bytes:
        head = orjson.dumps({"model": MODEL, "nonce": self.nonce, "pad": ""})[:-2]
        return head + b"x" * max(0, self.body_bytes - len(head) - 2) + b'"}'

    def headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "x-nonce": self.nonce, "x-framing": self.framing}
        if self.delay_ms:
            headers["x-delay-ms"] = str(self.delay_ms)
        if self.answer_bytes:
            headers["x-answer-bytes"] = str(self.answer_bytes)
        if self.interim:
            headers["x-interim"] = "1"
        if self.status != 200:
            headers["x-status"] = str(self.status)
        headers.update(self.extra_headers)
        return headers


@dataclass(frozen=True)
class Seen:
    status: int
    content_type: str
    nonce_header: str
    body: bytes
    error: str = ""

    def delivered_to(self, ask: Ask) -> bool:
        """Whether this answer is the engine's answer to `ask` (its nonce and body digest)."""
        if self.error or self.nonce_header != ask.nonce:
            return False
        digest = hashlib.sha256(ask.body()).hexdigest()
        if self.content_type == "text/event-stream":
            return (
                all(
                    orjson.loads(line[6:]).get("nonce") == ask.nonce
                    for line in self.body.split(b"\n\n")
                    if line.startswith(b"data: {")
                )
                and f'"body_sha256":"{digest}"'.encode() in self.body
            )
        try:
            payload = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return False
        return bool(payload.get("nonce") == ask.nonce and payload.get("body_sha256") == digest)


async def _chunks(body: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


async def send(session: aiohttp.ClientSession, base: str, ask: Ask, path: str = "/v1/completions") -> Seen:
    body = ask.body()
    data: Any = _chunks(body) if ask.chunked else body
    try:
        async with session.post(base + path, data=data, headers=ask.headers(), expect100=ask.expect) as resp:
            raw = await resp.read()
            return Seen(resp.status, resp.content_type, resp.headers.get("x-nonce", ""), raw)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Seen(0, "", "", b"", f"{type(exc).__name__}: {exc}")


def new_nonce() -> str:
    return uuid4().hex


# -- the focused regression: a slow Expect request with ordinary ones behind it ---------------------


async def test_a_slow_expect_request_never_hands_its_answer_to_the_requests_behind_it(
    wire: Wire, session: aiohttp.ClientSession
) -> None:
    """The issue's reproduction: the engine's `100 Continue` to a slow request must not be taken for
    its answer, or the pooled connection hands the real answer to whoever uses it next."""
    asks: list[Ask] = []
    tasks: list[asyncio.Task[Seen]] = []
    for wave in range(3):
        slow = Ask(new_nonce(), 300, expect=True, delay_ms=400)
        asks.append(slow)
        tasks.append(asyncio.create_task(send(session, wire.router, slow)))
        await asyncio.sleep(0.1)
        for i in range(8):
            ordinary = Ask(new_nonce(), 200 + i, expect=(i % 3 == 0), framing=("length", "chunked")[i % 2])
            asks.append(ordinary)
            tasks.append(asyncio.create_task(send(session, wire.router, ordinary)))
        await asyncio.sleep(0.05 * wave)
    seen = await asyncio.gather(*tasks)
    wrong = [(ask.nonce, got) for ask, got in zip(asks, seen, strict=True) if not got.delivered_to(ask)]
    others = sum(bool(got.nonce_header) for _, got in wrong)
    print(
        f"\nslow-expect regression: {len(asks)} clients, {len(wrong)} not given their own answer "
        f"({others} given another client's, {len(wrong) - others} none)"
    )
    assert not wrong, wrong[:3]
    assert {got.status for got in seen} == {200}
    received = await engine_seen(session, wire)
    assert [entry["expect"] for entry in received] == [None] * len(asks)  # Expect is not forwarded


async def test_a_large_body_sent_the_way_curl_sends_it(wire: Wire, session: aiohttp.ClientSession) -> None:
    """curl sends `Expect: 100-continue` with any body over 1 MiB and waits for the 100 before sending
    it: the router answers the 100 itself and the engine's answer comes back whole."""
    ask = Ask(new_nonce(), 1_200_000)
    body = ask.body()
    host, port = wire.router.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = "".join(f"{k}: {v}\r\n" for k, v in ask.headers().items())
    writer.write(
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n{head}"
        f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode()
    )
    await writer.drain()
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(body)
    await writer.drain()
    final = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert final.startswith(b"HTTP/1.1 200 "), final
    length = next(
        int(line.split(b":")[1])
        for line in final.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    payload = orjson.loads(await reader.readexactly(length))
    writer.close()
    assert payload["nonce"] == ask.nonce
    assert payload["body_sha256"] == hashlib.sha256(body).hexdigest()


async def test_a_header_value_outside_latin1_is_a_400_naming_the_header(
    wire: Wire, session: aiohttp.ClientSession
) -> None:
    await engine_seen(session, wire)
    body = Ask(new_nonce(), 100).body()
    answer = await raw_http.exchange(
        wire.router,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + "x-request-id: résumé-中\r\n".encode()
        + b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
    )
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer[:300]
    error = orjson.loads(payload)["error"]
    assert error["param"] == "x-request-id" and "`x-request-id`" in error["message"], error
    echoed = next(line for line in head.split(b"\r\n") if line.lower().startswith(b"x-request-id:"))
    assert echoed.isascii() and "résumé".encode() not in echoed
    assert await engine_seen(session, wire) == []  # nothing went upstream


async def test_hop_by_hop_headers_and_those_the_connection_header_names_stay_at_the_router(
    wire: Wire, session: aiohttp.ClientSession
) -> None:
    await engine_seen(session, wire)
    ask = Ask(
        new_nonce(),
        100,
        extra_headers=(
            ("Connection", "keep-alive, X-Hop-Secret"),
            ("X-Hop-Secret", "only for the router"),
            ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"),
            ("Proxy-Authorization", "Basic eDp5"),
            ("X-Kept", "1"),
        ),
    )
    got = await send(session, wire.router, ask)
    assert got.delivered_to(ask), got
    [entry] = await engine_seen(session, wire)
    forwarded = set(entry["headers"])
    assert "x-kept" in forwarded and "x-nonce" in forwarded
    assert not forwarded & {"x-hop-secret", "keep-alive", "te", "proxy-authorization", "expect"}, forwarded


# -- the differential: the same generated requests straight to the engine and through the router -----

PATHS = ("/v1/completions", "/v1/chat/completions?stream=false", "/tokenize")
BODY_SIZES = st.one_of(
    st.integers(0, 4096), st.sampled_from([65_535, 65_536, 1_048_577, 1_200_000, 2 * 1024 * 1024])
)
EXTRA_HEADERS = st.lists(
    st.sampled_from(
        [
            ("Connection", "keep-alive"),
            ("Accept", "*/*"),
            ("User-Agent", "differential/1"),
            ("X-Custom", "kept"),
            ("TE", "trailers"),
            ("X-Request-Id", "client-chosen-id"),
        ]
    ),
    max_size=3,
    unique=True,
).map(tuple)


@st.composite
def asks(draw: st.DrawFn) -> tuple[str, str, Ask]:
    method = draw(st.sampled_from(["POST"] * 12 + ["GET", "PUT", "PATCH", "DELETE"]))
    ask = Ask(
        new_nonce(),
        draw(BODY_SIZES),
        framing=draw(st.sampled_from(["length", "chunked", "close", "sse"])),
        expect=draw(st.booleans()),
        chunked=draw(st.booleans()),
        delay_ms=draw(st.sampled_from([0, 0, 0, 20, 150])),
        answer_bytes=draw(st.sampled_from([0, 0, 5_000, 300_000])),
        interim=draw(st.booleans()),
        status=draw(st.sampled_from([200, 200, 200, 400, 404, 429, 500])),
        extra_headers=draw(EXTRA_HEADERS),
    )
    return method, draw(st.sampled_from(PATHS)), ask


async def send_as(
    session: aiohttp.ClientSession, base: str, method: str, path: str, ask: Ask, direct: bool
) -> Seen:
    body = ask.body()
    data: Any = _chunks(body) if ask.chunked else body
    headers = {**ask.headers(), "x-direct": "1"} if direct else ask.headers()
    try:
        async with session.request(
            method, base + path, data=data, headers=headers, expect100=ask.expect
        ) as resp:
            raw = await resp.read()
            seen = Seen(resp.status, resp.content_type, resp.headers.get("x-nonce", ""), raw)
    except (aiohttp.ClientError, TimeoutError) as exc:
        seen = Seen(0, "", "", b"", f"{type(exc).__name__}: {exc}")
    return seen


COUNTS = {"batches": 0, "requests": 0, "forwarded": 0, "wrong_client": 0, "mismatched": 0}


async def run_batch(session: aiohttp.ClientSession, wire: Wire, batch: list[tuple[str, str, Ask]]) -> None:
    """Send the batch concurrently twice, straight to the engine and through the router, and compare."""
    direct = [send_as(session, wire.engine, method, path, ask, True) for method, path, ask in batch]
    routed = [send_as(session, wire.router, method, path, ask, False) for method, path, ask in batch]
    results = await asyncio.gather(*direct, *routed)
    COUNTS["batches"] += 1
    for (method, _path, ask), straight, through in zip(
        batch, results[: len(batch)], results[len(batch) :], strict=True
    ):
        COUNTS["requests"] += 1
        assert straight.delivered_to(ask), (ask, straight)
        if method != "POST":  # the router serves only POST under /v1: its own 404, nothing forwarded
            assert through.status == 404 and b'"NotFoundError"' in through.body, (method, through)
            continue
        COUNTS["forwarded"] += 1
        if through.nonce_header and through.nonce_header != ask.nonce:
            COUNTS["wrong_client"] += 1
        if (through.status, through.content_type, through.nonce_header, through.body) != (
            straight.status,
            straight.content_type,
            straight.nonce_header,
            straight.body,
        ):
            COUNTS["mismatched"] += 1
        assert through.delivered_to(ask), (ask, through)
        assert through.status == straight.status, (ask, straight.status, through.status)
        assert through.content_type == straight.content_type
        assert through.body == straight.body, (ask, len(straight.body), len(through.body))


def test_the_router_answers_exactly_what_the_engine_answers_and_to_the_client_that_asked(
    wire: Wire,
) -> None:
    loop = asyncio.new_event_loop()
    connector_session: list[aiohttp.ClientSession] = []

    async def open_session() -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=0)
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30))

    connector_session.append(loop.run_until_complete(open_session()))

    @settings(
        max_examples=int(os.environ.get("CORRAL_DIFFERENTIAL_EXAMPLES", "100")),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(asks(), min_size=1, max_size=8))
    def check(batch: list[tuple[str, str, Ask]]) -> None:
        loop.run_until_complete(run_batch(connector_session[0], wire, batch))

    try:
        loop.run_until_complete(engine_seen(connector_session[0], wire))
        check()
        seen = loop.run_until_complete(engine_seen(connector_session[0], wire))
    finally:
        loop.run_until_complete(connector_session[0].close())
        loop.close()
    print(
        f"\ndifferential: {COUNTS['batches']} concurrent batches, {COUNTS['requests']} requests tried "
        f"(each straight to the engine and through the router), {COUNTS['forwarded']} forwarded; "
        f"delivered to the wrong client: {COUNTS['wrong_client']}; "
        f"answers that differed from the engine's: {COUNTS['mismatched']}"
    )
    assert COUNTS["wrong_client"] == 0 and COUNTS["mismatched"] == 0
    forwarded = [entry for entry in seen if "x-direct" not in entry["headers"]]
    assert len(forwarded) == COUNTS["forwarded"]  # each once: no retry, nothing extra
    assert not [entry for entry in forwarded if entry["expect"]]  # the router never forwards Expect
