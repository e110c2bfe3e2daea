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

import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import h11
import h11._readers
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    engine: str  # each side its own recording engine

    def seen(self) -> list[dict[str, Any]]:
        """What this side's engine was sent since the last look (and forget it)."""
        with urlopen(self.engine + "/_seen?reset=1", timeout=10) as resp:
            entries: list[dict[str, Any]] = orjson.loads(resp.read())
        return entries


@dataclass(frozen=True)
class Routers:
    sides: tuple[Side, ...]

    def side(self, name: str) -> Side:
        return next(side for side in self.sides if side.name == name)


@pytest.fixture(scope="module")
def routers() -> Iterator[Routers]:
    engines: list[subprocess.Popen[bytes]] = []
    procs: list[CorralProcess] = []
    sides: list[Side] = []
    try:
        for server in ("lean", "aiohttp"):
            engine, engine_url = recording_engine.start(ROOT)
            engines.append(engine)
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
            sides.append(Side(server, "127.0.0.1", port, engine_url))
        yield Routers(tuple(sides))
    finally:
        for proc in procs:
            proc.stop()
        for engine in engines:
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
        except TimeoutError:
            return False  # nothing more came in time; still open
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
    side = routers.side(server)
    side.seen()
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
    assert [entry["body"] for entry in side.seen()] == []


@pytest.mark.parametrize("server", ["lean", "aiohttp"])
def test_a_request_hidden_in_a_connect_body_is_never_served(routers: Routers, server: str) -> None:
    """llhttp reads the bytes after a CONNECT head as the tunnel's; once the router declined the tunnel,
    aiohttp parsed them as new requests, so a request hidden in a CONNECT's declared body was served
    (on both sides: the lean server handed CONNECT to aiohttp with its bytes). The router opens no
    tunnel: 400, `Connection: close`, and nothing after the CONNECT head is parsed."""
    side = routers.side(server)
    side.seen()
    hidden = inference("hidden-in-connect")
    attack = b"CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        len(hidden),
        hidden,
    )
    for before in (b"", HEALTH_ANSWER):  # and after a first request (the lean server handed off)
        client = Client(side)
        client.sock.settimeout(5)  # the old code kept the connection open: read what came by then
        client.send(before + attack)
        answers = []
        while (got := client.answer()) is not None:
            answers.append(got)
        client.close()
        assert [entry["body"] for entry in side.seen()] == [], "the hidden request reached the engine"
        assert [status for status, _, _ in answers] == [200] * bool(before) + [400], answers
        assert client.closed, "the connection stays open after a CONNECT"
        refusal = answers[-1]
        assert refusal[1].get("connection", "").lower() == "close", refusal[1]
        assert b"CONNECT is not served" in refusal[2], refusal[2]


@pytest.mark.parametrize("server", ["lean", "aiohttp"])
def test_a_chunked_bodys_trailers_never_reach_the_engine_as_headers(routers: Routers, server: str) -> None:
    """Issue 27, finding 7: the lean server appended a chunked body's trailers to the request's
    headers. Trailers are dropped (as aiohttp drops them), on the lean path and across the hand-off."""
    side = routers.side(server)
    side.seen()
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
    seen = side.seen()
    assert [entry["body"].encode("latin-1") for entry in seen] == [body, body]
    for entry in seen:
        names = {name.lower() for name, _ in entry["headers"]}
        assert not names & {"x-trailer", "authorization"}, entry["headers"]


# -- the differential: generated byte streams, both server sides, h11 as the oracle -----------------

INFERENCE = b"/v1/completions"
HEALTH_ANSWER = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
MAX_LINE = 8190  # aiohttp's per-field and request-line limit, the lean server's too (serving.wire)
MAX_HEADERS = 128

# Where h11 and the routers differ by a documented rule. Each is applied to the oracle's verdict (never
# a skip) and counted; the test prints the counts.
NORMALIZATIONS = {
    "head_limits": "a request line or a header field (name + value) over 8190 bytes, or more than 128 "
    "headers: both routers refuse (aiohttp's limits, RFC 9112 leaves them to the server); h11 only "
    "limits the whole head",
    "body_too_large": "a body over --max-body-size: answered 413 and never forwarded; the connection "
    "closes after it (the router does not read a body it refused)",
    "not_forwarded": "a request the router answers itself (GET /health, a POST to a path it does not "
    "serve, a body that is not a JSON object): accepted by h11, answered by the router, never forwarded",
    "connect": "CONNECT: the router never tunnels, so the request ends the connection (400, close): "
    "stricter than h11, which reads its declared body and goes on",
    "upgrade_tail": "after a request with `Connection: upgrade` the router does not switch for, aiohttp "
    "drops the bytes pipelined behind it in the same read (llhttp pauses there); h11 serves them. The "
    "lean server hands such a request and every byte after it to aiohttp, so both sides drop them: "
    "nothing after it is compared",
    "ctl_in_value": "a control character (not HTAB) in a header value: h11 accepts it; both routers' "
    "parsers refuse the request (400, close: RFC 9110 §5.5, not a valid field value)",
    "bare_lf": "a head line ended by a bare LF: RFC 9112 §2.2 lets a recipient accept it (h11 does) or "
    "not; llhttp refuses (400, close)",
    "obs_text_value": "a header value with bytes over 0x7F (obs-text, which RFC 9110 §5.5 keeps for old "
    "senders only): h11 accepts it; the router answers 400 naming the header and forwards nothing",
    "partial_head": "a stream that ends inside a head: llhttp refuses a bad line as soon as it has it, "
    "h11 waits for the whole head; 'open' and 'refused' are both correct, and so is closing without an "
    "answer when what came cannot begin a request line (RFC 9112 §3: a method is a token) or has a line "
    "ended by a bare LF",
    "obs_fold": "obs-fold (a header line continued on the next): RFC 9112 §5.2 lets a server refuse it "
    "(400) or replace it with SP; h11 replaces, llhttp refuses",
    "cl_duplicates": "Content-Length twice with the same value, or as a list of one value (`N, N`): RFC "
    "9110 §8.6 lets a recipient reject it or take the one value; h11 takes it, both routers refuse (400)",
    "te_on_http10": "Transfer-Encoding in an HTTP/1.0 request: RFC 9112 §6.1 says a server MUST treat "
    "its framing as faulty and close after it; h11 reads the chunks, both routers refuse (400, close)",
    "te_and_cl": "Transfer-Encoding and Content-Length together: RFC 9112 §6.1 lets a server reject the "
    "request (it ought to close after it anyway); h11 takes Transfer-Encoding, both routers refuse (400)",
    "chunk_grammar": "a chunk-size line outside RFC 9112 §7.1's grammar (whitespace after the size without "
    "an extension, an extension name that is not a token): h11 accepts it, llhttp refuses; the oracle "
    "holds chunk lines to the RFC",
    "declared_too_large": "a Content-Length over --max-body-size: answered 413 from the head, without "
    "reading the body (RFC 9110 §15.5.14), then the connection closes",
    "lingering_close": "a request answered from its head while its body is still coming (a declared body "
    "over the limit, a path the router answers itself): the server reads and drops the rest for a while "
    "before it closes (RFC 9112 §9.6's lingering close, aiohttp's 10 s), where the oracle closes at once; "
    "nothing more is forwarded either way",
    "answered_then_broken": "a request the router answers from its head (a path it answers itself) whose "
    "body then breaks its framing: the oracle refuses with a 400, but that request has its answer already "
    "and a second one would be no valid HTTP; the server drains and closes (RFC 9112 §9.6) instead, "
    "forwarding nothing",
    "answered_before_body": "a request the router does not forward (not an inference path, or a declared "
    "body over the limit) is answered from its head: a stream that ends inside its body has its answer",
}
# RFC 9112 §7.1: chunk = chunk-size [ chunk-ext ] CRLF, chunk-ext = *( BWS ";" BWS chunk-ext-name
# [ BWS "=" BWS chunk-ext-val ] ), names and values tokens or quoted strings
_TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t -~\x80-\xff])*"'
_BWS = rb"[ \t]*"
_CHUNK_LINE = re.compile(
    rb"(?P<chunk_size>[0-9A-Fa-f]{1,20})(?P<chunk_ext>(?:%s;%s%s(?:%s=%s(?:%s|%s))?)*)\r\n"
    % (_BWS, _BWS, _TOKEN, _BWS, _BWS, _TOKEN, _QUOTED)
)
_STRICTER: set[str] = set()  # the normalizations the stricter chunk lines applied in this oracle() call


class _RfcChunkLine:
    """h11's chunk-line pattern (h11._readers.chunk_header_re) held to RFC 9112 §7.1: h11 takes
    whitespace after the size and any bytes in an extension. Counted where only h11's matched."""

    lenient = h11._readers.chunk_header_re

    def fullmatch(self, line: bytes) -> re.Match[bytes] | None:
        match = _CHUNK_LINE.fullmatch(line)
        if match is None and self.lenient.fullmatch(line):
            _STRICTER.add("chunk_grammar")
        return match


h11._readers.chunk_header_re = _RfcChunkLine()  # type: ignore[assignment]  # the oracle only

COUNTS: dict[str, int] = {"cases": 0, "divergences": 0, **dict.fromkeys(NORMALIZATIONS, 0)}
AIOHTTP_DIVERGENCES: dict[str, int] = {}


@dataclass(frozen=True)
class Forwarded:
    """A request as it reached the engine: what must match."""

    method: str
    target: str
    body: bytes
    probe: str | None  # the generated X-Probe header's value


@dataclass(frozen=True)
class Verdict:
    forwarded: tuple[Forwarded, ...]
    ending: str  # open (waits for more) | refused (400, closed) | closed (after an answer, no error)
    answers: int = 0  # final answers the router owes before the ending
    at_boundary: bool = False  # open: the stream ended between requests (not inside one)
    in_head: bool = False  # open: the stream ended inside a request's head
    # open or refused: inside the body of a request the router answers from its head
    answered_early: bool = False
    no_request_line: bool = False  # open inside a head that a parser may refuse already (no request
    # line can begin so, or a line ends in a bare LF): closing without an answer is correct too


def oracle(stream: bytes) -> tuple[Verdict, set[str]]:
    """What a correct router does with `stream`, by h11, and the normalizations applied."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 22)
    conn.receive_data(stream)
    forwarded: list[Forwarded] = []
    applied: set[str] = set()
    answers = 0
    request: h11.Request | None = None
    body = bytearray()
    head = b""
    early = False
    _STRICTER.clear()
    try:
        while True:
            if conn.their_state is h11.IDLE:
                head = bytes(conn._receive_buffer)  # the next request's head starts here (raw checks)
            event = conn.next_event()
            if event is h11.NEED_DATA:
                idle = conn.their_state is h11.IDLE
                boundary = idle and not conn.trailing_data[0]
                in_body = conn.their_state is h11.SEND_BODY
                partial = bytes(conn._receive_buffer).lstrip(b"\r\n")
                verdict = Verdict(
                    tuple(forwarded),
                    "open",
                    answers,
                    boundary,
                    idle and not boundary,
                    in_body and early,
                    idle
                    and (_REQUEST_LINE_START.match(partial) is None or _BARE_LF.search(partial) is not None),
                )
                return verdict, applied
            if isinstance(event, h11.Request):
                request, body = event, bytearray()
                raw, bare_lf = _head_lines(head)
                if bare_lf:
                    applied.add("bare_lf")
                    return Verdict(tuple(forwarded), "refused", answers), applied
                if any(_ctl(v) for _, v in event.headers.raw_items()):
                    applied.add("ctl_in_value")
                    return Verdict(tuple(forwarded), "refused", answers), applied
                lengths = [v for k, v in raw if k == b"content-length"]
                if len(lengths) > 1 or any(b"," in v for v in lengths):
                    applied.add("cl_duplicates")
                    return Verdict(tuple(forwarded), "refused", answers), applied
                if lengths and any(k == b"transfer-encoding" for k, _ in raw):
                    applied.add("te_and_cl")
                    return Verdict(tuple(forwarded), "refused", answers), applied
                if event.http_version == b"1.0" and any(k == b"transfer-encoding" for k, _ in raw):
                    applied.add("te_on_http10")
                    return Verdict(tuple(forwarded), "refused", answers), applied
                if event.method == b"CONNECT":
                    applied.add("connect")
                    return Verdict(tuple(forwarded), "refused", answers), applied
                if (
                    len(event.target) > MAX_LINE
                    or len(event.headers) > MAX_HEADERS
                    or any(len(k) + len(v) > MAX_LINE for k, v in event.headers.raw_items())
                ):
                    applied.add("head_limits")
                    return Verdict(tuple(forwarded), "refused", answers), applied
                if any(k == b"x-fold" for k, _ in event.headers):  # only ever folded
                    applied.add("obs_fold")
                    return Verdict(tuple(forwarded), "refused", answers), applied
                if lengths and int(lengths[0]) > MAX_BODY:
                    applied.add("declared_too_large")
                    return Verdict(tuple(forwarded), "closed", answers + 1), applied
                early = event.method != b"POST" or event.target != INFERENCE
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                early = False  # its body is whole: a refusal from here on is another request's
                answers += 1
                if len(body) > MAX_BODY:
                    applied.add("body_too_large")
                    return Verdict(tuple(forwarded), "closed", answers), applied
                unsendable = not all(v.isascii() for _, v in request.headers.raw_items())
                if unsendable:
                    applied.add("obs_text_value")
                if not unsendable and _forwardable(request, bytes(body)):
                    probe = next((v.decode("latin-1") for k, v in request.headers if k == b"x-probe"), None)
                    forwarded.append(Forwarded("POST", INFERENCE.decode(), bytes(body), probe))
                else:
                    applied.add("not_forwarded")
                upgrade = any(k == b"connection" and b"upgrade" in v.lower() for k, v in request.headers)
                conn.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
                conn.send(h11.EndOfMessage())
                if conn.our_state is h11.MUST_CLOSE:
                    return Verdict(tuple(forwarded), "closed", answers), applied
                if upgrade and any(k == b"upgrade" for k, _ in request.headers):
                    applied.add("upgrade_tail")
                    return Verdict(tuple(forwarded), "upgrade", answers), applied
                conn.start_next_cycle()
            elif event is h11.PAUSED:
                return Verdict(tuple(forwarded), "open", answers), applied
    except h11.RemoteProtocolError:
        # `early`: the refusal is in the body of a request the router answers from its head
        return Verdict(tuple(forwarded), "refused", answers, answered_early=early), applied | _STRICTER


def _head_lines(head: bytes) -> tuple[list[tuple[bytes, bytes]], bool]:
    """A raw head's header lines as (lowercased name, stripped value), before h11 merges any, and
    whether a line of it ends in a bare LF."""
    block = re.split(rb"\r?\n\r?\n", head.lstrip(b"\r\n"), maxsplit=1)[0] + b"\r\n"
    bare_lf = re.search(rb"(?<!\r)\n", block) is not None
    lines = block.replace(b"\r\n", b"\n").split(b"\n")[1:-1]
    return [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(b":") for line in lines)], bare_lf


# what can begin a request line: a method (a token), then a space (RFC 9112 §3)
_REQUEST_LINE_START = re.compile(rb"%s?(?: |\Z)" % _TOKEN)
_BARE_LF = re.compile(rb"(?<!\r)\n")  # a line llhttp refuses as soon as it has it (bare_lf)


def _ctl(value: bytes) -> bool:
    return any((b < 0x20 and b != 0x09) or b == 0x7F for b in value)


def _forwardable(request: h11.Request, body: bytes) -> bool:
    if request.method != b"POST" or request.target != INFERENCE:
        return False
    try:
        return isinstance(orjson.loads(body), dict)
    except orjson.JSONDecodeError:
        return False


# -- generated streams -----------------------------------------------------------------------------

FRAMINGS = (
    "length",
    "length",
    "chunked",
    "chunked",
    "none",
    "length_short",
    "length_long",
    "cl_twice_same",
    "cl_twice_different",
    "cl_plus",
    "cl_list",
    "cl_space_inside",
    "te_and_cl",
    "cl_and_te",
    "te_gzip_chunked",
    "te_chunked_gzip",
    "te_twice",
    "te_uppercase",
    "te_identity",
    "te_on_10",
)
CHUNK_SIZES = (
    *("hex", "hex", "upper", "zeros", "extension"),
    *("bad_ext", "invalid", "space_before", "space_after"),
)


@st.composite
def chunked_body(draw: st.DrawFn, body: bytes, nl: bytes) -> bytes:
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=3)))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if body[a:b]]
    out = b""
    for piece in pieces:
        kind = draw(st.sampled_from(CHUNK_SIZES))
        size = {
            "hex": b"%x" % len(piece),
            "upper": b"%X" % len(piece),
            "zeros": b"000%x" % len(piece),
            "extension": b'%x;name="v"' % len(piece),
            "bad_ext": b"%x;\x01" % len(piece),
            "invalid": b"%xz" % len(piece),
            "space_before": b" %x" % len(piece),
            "space_after": b"%x " % len(piece),
        }[kind]
        out += size + nl + piece + draw(st.sampled_from([nl, nl, nl, b"", b"XX"]))
    out += b"0" + nl
    if draw(st.booleans()):
        out += b"X-Trailer: t" + nl
    return out + nl


@st.composite
def message(draw: st.DrawFn, index: int) -> bytes:
    nl = draw(st.sampled_from([b"\r\n"] * 9 + [b"\n"]))
    version = draw(st.sampled_from([b"1.1"] * 6 + [b"1.0"]))
    kind = draw(st.sampled_from(["inference"] * 8 + ["health", "not_served", "connect"]))
    method, target = {
        "inference": (b"POST", INFERENCE),
        "health": (b"GET", b"/health"),
        "not_served": (b"POST", b"/not-served"),
        "connect": (b"CONNECT", b"example.com:443"),
    }[kind]
    nonce = f"CASE{index}-{draw(st.integers(0, 999))}"  # CASE: the case number, 4 digits
    pad = draw(st.sampled_from([0, 0, 100, 5_000, MAX_BODY + 1]))
    body = orjson.dumps({"model": MODEL, "prompt": nonce, "pad": "x" * pad})
    if kind == "health" and draw(st.booleans()):
        body = b""
    headers: list[bytes] = []
    if version == b"1.1" or draw(st.booleans()):
        headers.append(b"Host: x")
    headers.append(b"Content-Type: application/json")
    headers.append(b"X-Probe: " + nonce.encode())
    for extra in draw(st.lists(st.sampled_from(EXTRAS), max_size=3, unique=True)):
        headers.extend(extra)
    if draw(st.integers(0, 9)) == 0:
        headers.append(b"X-Big: " + b"b" * (draw(st.sampled_from([8100, 8180, 8190, 9000])) - 7))
    if draw(st.integers(0, 14)) == 0:
        headers.extend(b"X-N%d: v" % i for i in range(draw(st.sampled_from([120, 124, 125, 126, 130]))))
    framing = draw(st.sampled_from(FRAMINGS))
    length = str(len(body)).encode()
    framed = body
    if framing == "length":
        headers.append(b"Content-Length: " + length)
    elif framing == "length_short":
        headers.append(b"Content-Length: %d" % max(0, len(body) - 5))
    elif framing == "length_long":
        headers.append(b"Content-Length: %d" % (len(body) + 5))
    elif framing == "cl_twice_same":
        headers += [b"Content-Length: " + length, b"Content-Length: " + length]
    elif framing == "cl_twice_different":
        headers += [b"Content-Length: " + length, b"Content-Length: %d" % (len(body) + 1)]
    elif framing == "cl_plus":
        headers.append(b"Content-Length: +" + length)
    elif framing == "cl_list":
        headers.append(b"Content-Length: " + length + b", " + length)
    elif framing == "cl_space_inside":
        headers.append(b"Content-Length: " + length[:1] + b" " + length[1:])
    elif framing == "none":
        framed = b""
    else:
        codings = {
            "chunked": b"chunked",
            "te_and_cl": b"chunked",
            "cl_and_te": b"chunked",
            "te_gzip_chunked": b"gzip, chunked",
            "te_chunked_gzip": b"chunked, gzip",
            "te_twice": b"chunked",
            "te_uppercase": b"CHUNKED",
            "te_identity": b"identity",
            "te_on_10": b"chunked",
        }[framing]
        if framing == "cl_and_te":
            headers.append(b"Content-Length: " + length)
        headers.append(b"Transfer-Encoding: " + codings)
        if framing == "te_twice":
            headers.append(b"Transfer-Encoding: chunked")
        if framing == "te_and_cl":
            headers.append(b"Content-Length: " + length)
        if framing == "te_on_10":
            version = b"1.0"
        framed = draw(chunked_body(body, nl)) if framing != "te_identity" else body
    if draw(st.integers(0, 11)) == 0:
        headers.insert(draw(st.integers(0, len(headers))), b"X-Fold: a" + nl + b" b")
    draw(st.randoms()).shuffle(headers)
    return method + b" " + target + b" HTTP/" + version + nl + b"".join(h + nl for h in headers) + nl + framed


EXTRAS = (
    (b"Connection: close",),
    (b"Connection: keep-alive",),
    (b"Connection: Upgrade", b"Upgrade: foo"),
    (b"Connection: upgrade", b"Upgrade: websocket"),
    (b"Upgrade: foo",),
    (b"Expect: 100-continue",),
    (b"X-Empty:",),
    (b"X-Tab:\tv\t",),
    (b"X-Space : v",),
    (b"X-Ctl: a\x01b",),
    (b"X-Del: a\x7fb",),
    (b"X-Latin: caf\xe9",),
    (b"X-Nul: a\x00b",),
    (b": no-name",),
)


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    count = draw(st.integers(1, 4))
    stream = b"".join(draw(message(i)) for i in range(count))
    if draw(st.integers(0, 4)) == 0:  # an early close: the client stops mid-stream
        stream = stream[: draw(st.integers(1, len(stream)))]
    return stream


# -- running a stream on one side ------------------------------------------------------------------

QUIET = 0.5  # a stream that ends inside a request: how long to watch for answers nobody asked for


def observe(side: Side, stream: bytes, expected: Verdict, case: str) -> Verdict:
    """What `side` did with `stream`: what its engine was sent for this case, and how it ended."""
    client = Client(side)
    try:
        client.sock.settimeout(10)
        try:
            client.send(stream)
        except OSError:
            pass  # it closed on us (a refusal): read what it said
        statuses: list[int] = []
        while len(statuses) < expected.answers:
            got = client.answer()
            if got is None:
                break
            statuses.append(got[0])
        ending = _ending(client, statuses, expected)
    finally:
        client.close()
    forwarded = tuple(
        Forwarded(
            entry["method"],
            entry["target"],
            entry["body"].encode("latin-1"),
            next((v for k, v in entry["headers"] if k.lower() == "x-probe"), None),
        )
        for entry in side.seen()
        if case.encode() in entry["body"].encode("latin-1")
    )
    return Verdict(forwarded, ending, len(statuses))


def _ending(client: Client, statuses: list[int], expected: Verdict) -> str:
    if len(statuses) < expected.answers:
        return f"closed after {statuses}"
    if expected.ending == "upgrade":
        return "upgrade"  # nothing after it is compared (NORMALIZATIONS["upgrade_tail"])
    if expected.ending == "open" and expected.at_boundary and not client.closed:
        client.send(HEALTH_ANSWER)  # the next answer must be this one's: nothing was hidden before it
        got = client.answer()
        if got is not None and got[0] == 200 and b'"status"' in got[2]:
            return "open"
        return f"answered {got and got[0]} to a /health sent after the stream"
    if expected.ending == "open":
        client.sock.settimeout(QUIET)
        extra = client.answer()
        return "open" if extra is None and not client.closed else f"answered {extra and extra[0]}"
    more: list[int] = []
    while (got := client.answer()) is not None:
        more.append(got[0])
    if not client.closed:
        return f"still open after {more}"
    if more == [400]:
        return "refused"
    return "closed" if not more else f"closed after {more}"


def compare(expected: Verdict, got: Verdict) -> str | None:
    """Why `got` is not `expected`, or None."""
    forwarded = got.forwarded
    if expected.ending == "upgrade":
        forwarded = forwarded[: len(expected.forwarded)]
    if forwarded != expected.forwarded:
        return f"forwarded {_short(forwarded)}, expected {_short(expected.forwarded)}"
    if got.ending != expected.ending:
        if expected.in_head and got.ending in ("answered 400", "refused"):
            COUNTS["partial_head"] += 1
            return None
        if expected.no_request_line and got.ending == "answered None":  # closed without an answer
            COUNTS["partial_head"] += 1
            return None
        if expected.answered_early and got.ending.startswith("answered "):
            COUNTS["answered_before_body"] += 1
            return None
        if expected.ending == "closed" and got.ending == "still open after []":
            COUNTS["lingering_close"] += 1
            return None
        broken = re.fullmatch(r"(still open|closed) after \[(\d+)\]", got.ending)
        if (
            expected.ending == "refused"
            and expected.answered_early
            and broken is not None
            and broken[2] != "400"
        ):
            COUNTS["answered_then_broken"] += 1
            return None
        return f"ended {got.ending!r}, expected {expected.ending!r}"
    return None


def _shown(stream: bytes) -> str:
    """`stream` for a failure report: runs of one byte (bodies' padding, big headers) shortened."""
    text = stream.decode("latin-1")
    return repr(re.sub(r"(.)\1{15,}", lambda m: f"<{m[1]}*{len(m[0])}>", text))


def _short(forwarded: tuple[Forwarded, ...]) -> list[tuple[str, int, str | None]]:
    return [(f.target, len(f.body), f.probe) for f in forwarded]


# aiohttp's own divergences from h11, which the lean server does not share; each is noted in
# /tmp/notes for the lead, not hidden: the test fails on any other
AIOHTTP_KNOWN = {
    "refused_read": "a malformed request (or bytes after a request that closes the connection) in the same "
    "socket read as valid ones before it: aiohttp's "
    "parser raises for the whole read, so the valid ones are neither forwarded nor answered, only the "
    "400 (never more than the oracle forwards; RFC 9112 §9.3.2: a client retries unanswered requests)",
}


def test_both_server_sides_forward_exactly_what_h11_accepts(routers: Routers) -> None:
    lean, aio = routers.side("lean"), routers.side("aiohttp")
    lean.seen(), aio.seen()
    pool = ThreadPoolExecutor(2)
    failures: list[str] = []
    started = time.monotonic()

    fuzzing = "CORRAL_HTTP_FUZZ_EXAMPLES" in os.environ  # scripts/fuzz-http: new streams every run

    @settings(
        max_examples=int(os.environ.get("CORRAL_HTTP_FUZZ_EXAMPLES", "150")),
        derandomize=not fuzzing,  # CI: the same 150 streams every run, so a red run is reproducible
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
    @given(streams())
    def check(stream: bytes) -> None:
        COUNTS["cases"] += 1
        case = b"%04d" % (COUNTS["cases"] % 10_000)
        stream = stream.replace(b"CASE", case)  # the prompt and probe carry the case (same length)
        expected, applied = oracle(stream)
        for name in applied:
            COUNTS[name] += 1
        on_lean = pool.submit(observe, lean, stream, expected, case.decode())
        on_aio = pool.submit(observe, aio, stream, expected, case.decode())
        lean_why, aio_why = compare(expected, on_lean.result()), compare(expected, on_aio.result())
        if lean_why is not None:
            COUNTS["divergences"] += 1
            failures.append(f"lean: {lean_why}\n  stream {_shown(stream)}")
        if aio_why is not None:
            got = on_aio.result()
            kind = "other"
            prefix = got.forwarded == expected.forwarded[: len(got.forwarded)]
            fewer = len(got.forwarded) < len(expected.forwarded)
            ended = got.ending == "refused" or got.ending.startswith("closed")
            if prefix and (expected.ending == "refused" or (fewer and ended)):
                kind = "refused_read"
            known = kind != "other"
            AIOHTTP_DIVERGENCES[kind] = AIOHTTP_DIVERGENCES.get(kind, 0) + 1
            if not known:
                COUNTS["divergences"] += 1
                failures.append(f"aiohttp: {aio_why}\n  stream {_shown(stream)}")

    try:
        check()
    finally:
        pool.shutdown()
        normalized = ", ".join(f"{name} {COUNTS[name]}" for name in NORMALIZATIONS)
        print(
            f"\ncases run {COUNTS['cases']}, divergences {COUNTS['divergences']} "
            f"({time.monotonic() - started:.0f} s); normalized: {normalized}; "
            f"aiohttp's own known divergences: {AIOHTTP_DIVERGENCES or 'none'}"
        )
        for failure in failures[:40]:
            print(failure)
    assert not failures, failures[:3]


UPGRADE_10_BODY = b'{"model":"nonce-model","prompt":"CASE"}'
GZIP_BODY = b'{"model":"nonce-model","prompt":"CASE"}'
# streams the fuzzer found diverging once, kept as regressions (each against the oracle on both sides)
FOUND = {
    "upgrade_with_gzip_chunked": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nUpgrade: foo\r\n"
    b"Content-Type: application/json\r\nConnection: Upgrade\r\nX-Probe: CASE\r\n"
    b'Transfer-Encoding: gzip, chunked\r\n\r\n5\r\n{"a":\r\n2 \r\n1}XX0\r\n\r\n',
    # llhttp read the chunks and ignored the gzip: the request was forwarded on both sides (issue 27)
    "gzip_chunked_with_expect": b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n"
    b"Content-Type: application/json\r\nX-Probe: CASE\r\nHost: x\r\nExpect: 100-continue\r\n\r\n"
    b"%x\r\n%s\r\n0\r\n\r\n" % (len(GZIP_BODY), GZIP_BODY),
    # aiohttp's parser refuses Transfer-Encoding on HTTP/1.0, except on an upgrade request: forwarded
    "te_on_http10_with_upgrade": b"POST /v1/completions HTTP/1.0\r\nUpgrade: foo\r\nConnection: Upgrade\r\n"
    b"X-Probe: CASE\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"%x\r\n%s\r\n0\r\n\r\n" % (len(UPGRADE_10_BODY), UPGRADE_10_BODY),
    "ctl_in_a_header_value": b"POST /v1/completions HTTP/1.0\r\nHost: x\r\nX-Ctl: a\x01b\r\n"
    b'Content-Length: 12\r\n\r\n{"m":"CASE"}',
}


@pytest.mark.parametrize("name", sorted(FOUND))
def test_streams_the_fuzzer_found(routers: Routers, name: str) -> None:
    stream = FOUND[name].replace(b"CASE", b"9999")
    expected, applied = oracle(stream)
    print(f"\n{name}: oracle {expected} {applied}")
    why = {}
    for side in routers.sides:
        side.seen()
        got = observe(side, stream, expected, "9999")
        print(f"  {side.name}: {got}")
        why[side.name] = compare(expected, got)
    assert why == {"lean": None, "aiohttp": None}
