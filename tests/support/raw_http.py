"""Raw bytes over a loopback socket, for tests that send what no HTTP client library would."""

from __future__ import annotations

import asyncio


def content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return None


def complete(received: bytes) -> bool:
    """Whether `received` holds one whole answer framed by content-length."""
    head, sep, body = received.partition(b"\r\n\r\n")
    length = content_length(head) if sep else None
    return length is not None and len(body) >= length


async def exchange(base: str, request: bytes, quiet_after: float = 10.0) -> bytes:
    """Send raw bytes on a fresh connection to `base` (http://host:port) and read until one answer
    is complete, the peer closes, or nothing came for `quiet_after` seconds."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    received = b""
    try:
        await writer.drain()
        while chunk := await asyncio.wait_for(reader.read(65536), quiet_after):
            received += chunk
            if complete(received):
                break
    except (TimeoutError, ConnectionError):
        pass
    writer.close()
    return received
