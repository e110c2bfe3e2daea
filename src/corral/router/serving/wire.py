"""Bytes on the client's wire for the lean server: answer heads, the checks aiohttp's parser makes
beyond llhttp's (so that both servers refuse the same requests), and aiohttp answers as Answers."""

from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus

from aiohttp import web

from corral.router.datapath.exchange import Answer, Headers
from corral.router.edge.refused_framing import coding_refusal

MAX_LINE = 8190  # request target, header name, header value: aiohttp's limits
MAX_HEADERS = 128
# RFC 9110 singleton headers: a second one is refused (as aiohttp's strict parser does)
SINGLETONS = frozenset(
    {
        "content-length",
        "content-location",
        "content-range",
        "content-type",
        "etag",
        "host",
        "max-forwards",
        "server",
        "transfer-encoding",
        "user-agent",
    }
)
CHUNKED_END = b"0\r\n\r\n"

_REASONS = {status.value: status.phrase for status in HTTPStatus}


class Malformed(Exception):
    """A request the lean server refuses with 400 before it reaches the router (the connection closes)."""


class DateHeader:
    """The Date header, formatted once a second."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = b"Date: " + formatdate(now, usegmt=True).encode("ascii") + b"\r\n"
        return self._value


def head(
    status: int, headers: Headers, framing: bytes, connection: bytes, date: bytes, version: str = "1.1"
) -> bytes:
    """An answer's head: status line, the headers as given, then Date, framing and Connection lines."""
    lines = "".join([f"{k}: {v}\r\n" for k, v in headers])
    reason = _REASONS.get(status, "Unknown")
    return (
        f"HTTP/{version} {status} {reason}\r\n{lines}".encode("latin-1")
        + date
        + framing
        + connection
        + b"\r\n"
    )


def answer_of(response: web.Response) -> tuple[Answer, bool]:
    """An aiohttp answer built by the edge checks (corral.router.edge), as an Answer, and whether it
    keeps the connection open."""
    headers = [(k, v) for k, v in response.headers.items() if k.lower() != "content-length"]
    body = response.body
    assert isinstance(body, bytes)
    return Answer(response.status, body, headers), response.keep_alive is not False


def check_header(name: bytes, value: bytes, seen: set[str], count: int) -> tuple[str, str]:
    """One header as the router reads it (latin-1, trailing blanks dropped), or Malformed."""
    if len(name) > MAX_LINE or len(value) > MAX_LINE:
        raise Malformed(f"Got more than {MAX_LINE} bytes when reading a header")
    if count >= MAX_HEADERS:
        raise Malformed("Too many headers received")
    value = value.rstrip(b" \t")
    if b"\x00" in value:
        raise Malformed("Invalid header value char")
    key = name.decode("latin-1")
    lower = key.lower()
    if lower in SINGLETONS:
        if lower in seen:
            raise Malformed(f"Duplicate '{key}' header found")
        seen.add(lower)
    return key, value.decode("latin-1")


def check_head(version: str, headers: Headers, seen: set[str]) -> None:
    """What aiohttp refuses in a whole head that llhttp lets through, and a transfer coding other than
    chunked (refused on the aiohttp side by corral.router.edge.refused_framing)."""
    if version == "1.1" and "host" not in seen:
        raise Malformed("Missing 'Host' header in request")
    if "transfer-encoding" in seen and version != "1.1":
        raise Malformed("Transfer-Encoding is not allowed before HTTP/1.1")
    if "content-length" in seen:
        length = next(v for k, v in headers if k.lower() == "content-length")
        if not (length.isascii() and length.isdigit()):
            raise Malformed("Invalid Content-Length")
        if "transfer-encoding" in seen:
            raise Malformed("Transfer-Encoding can't be present with Content-Length")
    if "transfer-encoding" in seen:
        why = coding_refusal(next(v for k, v in headers if k.lower() == "transfer-encoding"))
        if why is not None:  # what the aiohttp side's first middleware refuses (edge.refused_framing)
            raise Malformed(why)
