"""Raw bytes over a loopback socket, for tests that send what no HTTP client library would."""

from __future__ import annotations

import asyncio


def content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return None


def answers_in(received: bytes) -> list[bytes]:
    """The status lines of the whole final answers (framed by content-length) at the start of
    `received`, 1xx interim answers included in order."""
    statuses: list[bytes] = []
    rest = received
    while True:
        head, sep, tail = rest.partition(b"\r\n\r\n")
        if not sep:
            return statuses
        status = head.split(b"\r\n", 1)[0]
        if status[9:10] == b"1":  # 100 Continue and friends: no body
            statuses.append(status)
            rest = tail
            continue
        length = content_length(head)
        if length is None or len(tail) < length:
            return statuses
        statuses.append(status)
        rest = tail[length:]


async def exchange(base: str, request: bytes, answers: int = 1, quiet_after: float = 10.0) -> bytes:
    """Send raw bytes on a fresh connection to `base` (http://host:port) and read until `answers`
    final answers came, the peer closed, or nothing came for `quiet_after` seconds."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    received = b""
    try:
        await writer.drain()
        while chunk := await asyncio.wait_for(reader.read(65536), quiet_after):
            received += chunk
            if sum(not s[9:10] == b"1" for s in answers_in(received)) >= answers:
                break
    except (TimeoutError, ConnectionError):
        pass
    writer.close()
    return received
