"""The router's two server sides held to a reference HTTP/1.1 parser: the same raw byte streams go to
`corral router` on its lean server (the default) and on aiohttp's (`--http-server aiohttp`), both in
front of an engine that records every request it is sent (tests/support/recording_engine.py), and
into h11 (an independent HTTP/1.1 implementation) used in-process as the oracle. A correct server
forwards exactly the requests h11 accepts, in order, with their bodies, or refuses (400 and close)
where h11 refuses.

Where h11 and both routers differ by a documented rule, the difference is a named normalization
(NORMALIZATIONS below), counted, never a silent skip. The Hypothesis test prints how many streams it
ran and how many diverged; CORRAL_HTTP_FUZZ_EXAMPLES sets its budget (scripts/fuzz-http runs it long).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import orjson
import pytest

from tests.support import recording_engine
from tests.support.procs import CorralProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL = recording_engine.MODEL
MAX_BODY = 64 * 1024  # --max-body-size for both routers: oversized bodies are cheap to generate


@dataclass(frozen=True)
class Side:
    name: str  # lean | aiohttp
    host: str
    port: int


@dataclass(frozen=True)
class Routers:
    engine: str
    sides: tuple[Side, ...]

    def seen(self) -> list[dict[str, Any]]:
        """What the engine was sent since the last look (and forget it)."""
        with urlopen(self.engine + "/_seen?reset=1", timeout=10) as resp:
            entries: list[dict[str, Any]] = orjson.loads(resp.read())
        return entries


@pytest.fixture(scope="module")
def routers() -> Iterator[Routers]:
    engine, engine_url = recording_engine.start(ROOT)
    procs: list[CorralProcess] = []
    sides: list[Side] = []
    try:
        for server in ("lean", "aiohttp"):
            port = free_port()
            proc = CorralProcess(
                [
                    "router",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--backend",
                    engine_url,
                    "--max-retries",
                    "0",
                    "--max-body-size",
                    str(MAX_BODY),
                    "--http-server",
                    server,
                ]
            )
            procs.append(proc)
            proc.wait_http(f"http://127.0.0.1:{port}/health")
            sides.append(Side(server, "127.0.0.1", port))
        yield Routers(engine_url, tuple(sides))
    finally:
        for proc in procs:
            proc.stop()
        recording_engine.stop(engine)


def inference(nonce: str, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    body = orjson.dumps({"model": MODEL, "prompt": nonce})
    return (
        b"POST /v1/completions HTTP/%s\r\nHost: x\r\nContent-Type: application/json\r\n%s"
        b"Content-Length: %d\r\n\r\n%s" % (version, extra, len(body), body)
    )


class Client:
    """A raw connection: bytes out, whole answers in (content-length framed, as both routers answer)."""

    def __init__(self, side: Side) -> None:
        self.sock = socket.create_connection((side.host, side.port), timeout=20)
        self.buffer = b""
        self.closed = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self) -> tuple[int, dict[str, str], bytes] | None:
        """The next final answer, or None when the router closed the connection first."""
        while True:
            head, sep, rest = self.buffer.partition(b"\r\n\r\n")
            if sep:
                lines = head.decode("latin-1").split("\r\n")
                status = int(lines[0].split(" ")[1])
                headers = {
                    k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])
                }
                length = int(headers.get("content-length", "0"))
                if len(rest) >= length:
                    self.buffer = rest[length:]
                    if status >= 200:
                        return status, headers, rest[:length]
                    continue
            if not self._read():
                return None

    def _read(self) -> bool:
        if self.closed:
            return False
        try:
            data = self.sock.recv(65536)
        except ConnectionError:
            data = b""
        if not data:
            self.closed = True
        self.buffer += data
        return bool(data)

    def close(self) -> None:
        self.sock.close()


# -- focused regressions (issue 27) ------------------------------------------------------------


@pytest.mark.parametrize("server", ["lean", "aiohttp"])
def test_a_request_hidden_in_an_upgrade_requests_body_is_never_served(routers: Routers, server: str) -> None:
    """Issue 27, finding 1: `Connection: Upgrade` made llhttp skip the POST's body and the lean server
    parsed the body's bytes as a new request, which reached the engine and was answered (two answers
    to one request). The body is the body: one answer, and nothing hidden reaches the engine."""
    [side] = [s for s in routers.sides if s.name == server]
    routers.seen()
    hidden = inference("hidden")
    attack = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: Upgrade\r\nUpgrade: foo\r\nContent-Length: %d\r\n\r\n%s" % (len(hidden), hidden)
    )
    client = Client(side)
    client.send(attack)
    first = client.answer()
    assert first is not None and first[0] == 400, first
    if not client.closed:  # kept alive: the next answer is the next request's, not the hidden one's
        client.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        second = client.answer()
        assert second is None or orjson.loads(second[2]).get("status") == "ok", second
    client.close()
    assert [entry["body"] for entry in routers.seen()] == []


@pytest.mark.parametrize("server", ["lean", "aiohttp"])
def test_a_chunked_bodys_trailers_never_reach_the_engine_as_headers(routers: Routers, server: str) -> None:
    """Issue 27, finding 7: the lean server appended a chunked body's trailers to the request's
    headers. Trailers are dropped (as aiohttp drops them), on the lean path and across the hand-off."""
    [side] = [s for s in routers.sides if s.name == server]
    routers.seen()
    body = orjson.dumps({"model": MODEL, "prompt": "trailers"})
    chunked = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\nX-Trailer: smuggled\r\n"
        b"Authorization: Bearer from-a-trailer\r\n\r\n" % (len(body), body)
    )
    client = Client(side)
    client.send(chunked)  # on the lean path
    assert (client.answer() or (0,))[0] == 200
    client.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + chunked)  # after the hand-off to aiohttp
    assert (client.answer() or (0,))[0] == 200
    assert (client.answer() or (0,))[0] == 200
    client.close()
    seen = routers.seen()
    assert [entry["body"].encode("latin-1") for entry in seen] == [body, body]
    for entry in seen:
        names = {name.lower() for name, _ in entry["headers"]}
        assert not names & {"x-trailer", "authorization"}, entry["headers"]
