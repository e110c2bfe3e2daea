"""`corral router`'s client-side limits, faced with real sockets on loopback: a slowloris header, a
stalled body, an idle keep-alive connection, one connection too many, one request too many and a
body over the limit are each cut or refused, the router keeps serving everyone else, and each shows
on /metrics. The last test pins what the limits lean on in aiohttp, in-process."""

from __future__ import annotations

import asyncio
import logging
import select
import socket
import time
from collections.abc import Iterator

import aiohttp
import orjson
import pytest
from aiohttp import web

from corral.router.edge.client_connections import ConnectionGuard
from corral.router.edge.client_limit_flags import ClientLimits
from corral.router.edge.client_limits import ClientLimitStats, client_limits_middleware
from tests.integration.test_router_passthrough import start_router
from tests.support.procs import CorralProcess, start_sim
from tests.support.prom import sample, scrape

# Generous bounds on every wait: the assertions are about what happens, not how fast.
WAIT = 10.0
SIM_ARGS = ("--seed", "0", "--ttft-base-ms", "5", "--itl-ms", "20")


def chat(max_tokens: int) -> bytes:
    return orjson.dumps(
        {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    )


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    proc, url = start_sim(None, *SIM_ARGS)
    try:
        yield url
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def timeouts_router(sim: str) -> Iterator[str]:
    """Short timeouts and a 1 MiB body limit, shared by the timeout and body tests."""
    router, url = start_router(
        sim,
        extra=(
            "--header-timeout", "1",
            "--body-timeout", "1",
            "--idle-timeout", "1",
            "--max-body-size", "1MiB",
        ),
    )  # fmt: skip
    try:
        yield url
    finally:
        router.stop()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def connect(url: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port_of(url)), timeout=WAIT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_until_closed(sock: socket.socket, within: float = WAIT) -> bytes:
    """Everything the server sends until it closes the connection; fails if it is still open."""
    sock.settimeout(within)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        return got
    except TimeoutError:
        raise AssertionError(
            f"the router kept the connection open for {within} s; it sent {got[:200]!r}"
        ) from None
    return got


def unanswered(sock: socket.socket) -> bool:
    """Nothing has come back yet: no answer, no close."""
    readable, _, _ = select.select([sock], [], [], 0)
    return not readable


def request_on(sock: socket.socket, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one request on an open connection and read its answer (which has a Content-Length)."""
    sock.sendall(raw)
    sock.settimeout(WAIT)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed before an answer: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def metric(url: str, name: str, **labels: str) -> float:
    value = sample(scrape(url + "/metrics"), name, **labels)
    assert value is not None, f"{name}{labels} is not on {url}/metrics"
    return value


def closed(url: str, reason: str) -> float:
    return metric(url, "corral_router_client_connections_closed_total", reason=reason)


def rejected(url: str, reason: str) -> float:
    return metric(url, "corral_router_client_rejected_total", reason=reason)


def test_slowloris_header_is_cut_at_the_header_timeout(timeouts_router: str) -> None:
    url = timeouts_router
    before = closed(url, "header_timeout")
    sock = connect(url)
    header = b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
    deadline = time.monotonic() + WAIT
    sent = 0
    try:
        # a byte every 100 ms: never silent long enough for an idle timer, never a whole header
        while time.monotonic() < deadline and unanswered(sock):
            sock.send(header[sent % len(header) : sent % len(header) + 1])
            sent += 1
            time.sleep(0.1)
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = read_until_closed(sock, within=2.0)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"--header-timeout" in answer
    assert closed(url, "header_timeout") == before + 1


def test_connection_that_never_sends_is_cut_at_the_header_timeout(timeouts_router: str) -> None:
    url = timeouts_router
    before = closed(url, "header_timeout")
    sock = connect(url)
    assert read_until_closed(sock) == b""  # nothing was asked, so nothing is answered
    sock.close()
    assert closed(url, "header_timeout") == before + 1


def test_stalled_body_gets_408_and_the_connection_is_cut(timeouts_router: str) -> None:
    url = timeouts_router
    before = closed(url, "body_timeout")
    sock = connect(url)
    body = chat(2)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body[:10]
    )
    answer = read_until_closed(sock)
    sock.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    error = orjson.loads(payload)["error"]
    assert error["code"] == 408 and "--body-timeout" in error["message"]
    assert closed(url, "body_timeout") == before + 1


def test_idle_keepalive_connection_is_closed(timeouts_router: str) -> None:
    url = timeouts_router
    before = closed(url, "idle_timeout")
    sock = connect(url)
    status, headers, _ = request_on(sock, get("/health"))
    assert status == 200 and headers.get("connection", "").lower() != "close"
    # the same connection serves a second request while it is not idle for long
    assert request_on(sock, get("/health"))[0] == 200
    assert read_until_closed(sock) == b""
    sock.close()
    assert closed(url, "idle_timeout") == before + 1


def test_declared_body_over_the_limit_gets_413_before_it_is_sent(timeouts_router: str) -> None:
    url = timeouts_router
    before = rejected(url, "body_too_large")
    sock = connect(url)
    size = 2 * 1024 * 1024
    # only the header: the answer must come without the router waiting for the 2 MiB
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {size}\r\n\r\n".encode()
    )
    status, headers, body = request_on(sock, b"")
    sock.close()
    assert status == 413, body
    assert headers["connection"].lower() == "close"
    error = orjson.loads(body)["error"]
    assert error["code"] == 413
    assert "1 MiB" in error["message"] and "--max-body-size" in error["message"]
    assert rejected(url, "body_too_large") == before + 1


def test_chunked_body_growing_over_the_limit_gets_413(timeouts_router: str) -> None:
    url = timeouts_router
    before = rejected(url, "body_too_large")
    sock = connect(url)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"x" * (256 * 1024)
    sent = 0
    answer = b""
    try:
        while sent < 8 * 1024 * 1024:  # the router must answer long before this
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sent += len(chunk)
            if select.select([sock], [], [], 0.05)[0]:
                answer = sock.recv(65536)
                break
        else:
            sock.sendall(b"0\r\n\r\n")
            answer = sock.recv(65536)
    except (BrokenPipeError, ConnectionResetError):
        pass
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413"), (sent, answer[:300])
    assert b"--max-body-size" in answer
    assert rejected(url, "body_too_large") == before + 1


def test_connection_cap_closes_the_extra_connection_and_keeps_the_others(sim: str) -> None:
    router, url = start_router(
        sim, extra=("--max-connections", "3", "--header-timeout", "30", "--idle-timeout", "30")
    )
    socks = [connect(url), connect(url), connect(url)]
    try:
        status, _, body = request_on(socks[2], get("/metrics"))
        assert status == 200
        assert sample(body.decode(), "corral_router_client_connections_open") == 3
        assert sample(body.decode(), "corral_router_client_limit", limit="max_connections") == 3

        extra = connect(url)
        answer = read_until_closed(extra)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"--max-connections" in answer and b"Retry-After: 1" in answer

        for sock in socks:  # the three admitted connections are served as before
            assert request_on(sock, get("/health"))[0] == 200
        status, _, body = request_on(socks[0], get("/metrics"))
        assert sample(body.decode(), "corral_router_client_rejected_total", reason="max_connections") == 1

        socks.pop().close()  # below the cap again: a new connection is served
        deadline = time.monotonic() + WAIT
        while metric_on(socks[0], "corral_router_client_connections_open") != 2:
            assert time.monotonic() < deadline, "the closed connection is still counted"
            time.sleep(0.05)
        fresh = connect(url)
        socks.append(fresh)
        assert request_on(fresh, get("/health"))[0] == 200
    finally:
        for sock in socks:
            sock.close()
        router.stop()


def metric_on(sock: socket.socket, name: str, **labels: str) -> float | None:
    _, _, body = request_on(sock, get("/metrics"))
    return sample(body.decode(), name, **labels)


async def test_in_flight_cap_answers_503_with_retry_after_and_recovers(sim: str) -> None:
    router, url = start_router(sim, extra=("--max-in-flight", "2"))
    try:
        async with aiohttp.ClientSession() as s:

            async def completion(max_tokens: int) -> tuple[int, dict[str, str], bytes]:
                async with s.post(url + "/v1/chat/completions", data=chat(max_tokens)) as resp:
                    return resp.status, dict(resp.headers), await resp.read()

            slow = [asyncio.create_task(completion(250)) for _ in range(2)]  # ~5 s each
            deadline = time.monotonic() + WAIT
            while metric(url, "corral_router_client_requests_in_flight") < 2:
                assert time.monotonic() < deadline, "the two slow requests never were in flight"
                await asyncio.sleep(0.05)

            status, headers, body = await completion(2)
            assert status == 503, body
            assert headers["Retry-After"] == "1"
            error = orjson.loads(body)["error"]
            assert error["code"] == 503 and "--max-in-flight" in error["message"]
            # an operator can still see the router while it is full
            async with s.get(url + "/health") as resp:
                assert resp.status == 200
            assert rejected(url, "max_in_flight") == 1
            assert not any(t.done() for t in slow)

            assert [r[0] for r in await asyncio.gather(*slow)] == [200, 200]
            assert (await completion(2))[0] == 200  # recovered
            assert metric(url, "corral_router_client_requests_in_flight") == 0
    finally:
        router.stop()


def test_defaults_bound_a_slowloris_to_at_most_15_seconds(sim: str) -> None:
    router, url = start_router(sim)
    try:
        assert 0 < metric(url, "corral_router_client_limit", limit="header_timeout_seconds") <= 15
        assert metric(url, "corral_router_client_limit", limit="max_body_bytes") == 32 * 1024 * 1024
        for limit in ("body_timeout_seconds", "idle_timeout_seconds", "max_connections", "max_in_flight"):
            assert metric(url, "corral_router_client_limit", limit=limit) > 0
    finally:
        router.stop()


def test_bad_limit_flag_names_the_flag_and_value() -> None:
    proc = CorralProcess(["router", "--backend", "http://127.0.0.1:9", "--max-body-size", "lots"])
    assert proc.wait_exit(timeout=30) == 2
    out = proc.output()
    proc.stop()
    # the refusal is the contract: one line naming the value and what to do
    assert "--max-body-size" in out and "lots" in out and "MiB" in out


async def test_guard_holds_aiohttp_to_what_it_relies_on(caplog: pytest.LogCaptureFixture) -> None:
    """In-process: the guard's protocol wraps `runner.server()`, sees `request.transport` as the
    transport it was given (the request moves it out of the header phase) and a stalled body read
    by the handler ends in the middleware's 408 with the connection closed and nothing logged as an
    error by aiohttp's lingering read. If aiohttp changed any of that underneath, this fails."""
    limits = ClientLimits(header_timeout=5, body_timeout=0.5, idle_timeout=5)
    stats = ClientLimitStats()
    guard = ConnectionGuard(limits, stats)
    seen: list[int] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(len(await request.read()))
        return web.Response(text="ok")

    app = web.Application(middlewares=[client_limits_middleware(limits, stats, guard, ())])
    app.router.add_post("/", echo)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    assert runner.server is not None
    listener = await guard.listen(runner.server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nabcd")
        head = await asyncio.wait_for(reader.readuntil(b"ok"), WAIT)
        assert head.startswith(b"HTTP/1.1 200") and seen == [4]
        assert stats.open_connections == 1

        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabcd")
        answer = await asyncio.wait_for(reader.read(), WAIT)  # to EOF: the router closed it
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert stats.closed["body_timeout"] == 1 and stats.closed["header_timeout"] == 0
        writer.close()
        deadline = time.monotonic() + WAIT
        while stats.open_connections:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
    finally:
        await guard.close()
        await runner.cleanup()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
