"""A raw HTTP/1.1 engine for the router's wire tests: it echoes each request's nonce and body digest,
frames its answer the way the request asks (length, chunked with trailers, close-delimited, SSE),
answers `100 Continue` to `Expect` as uvicorn does, and logs every request it parsed.

Written on bare asyncio streams so that it can do what a framework hides: interim 1xx answers,
trailers, bodies delimited by the close. Run it as `python -m tests.support.nonce_engine --port N`;
`GET /_seen` returns the log (`?reset=1` empties it after reading).

Request headers that steer the answer:
  x-nonce        echoed back in `X-Nonce` and in the body
  x-framing      length (default) | chunked | close | sse
  x-delay-ms     wait this long before the answer's head
  x-answer-bytes pad the body to about this many bytes
  x-interim      send a `103 Early Hints` before the answer
  x-status       answer with this status (default 200)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from corral.fleet.local.ports import free_port
from tests.support.waits import wait_until

MODEL = "nonce-model"
REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 429: b"Too Many Requests", 500: b"Error"}


class BadRequest(Exception):
    """The engine could not parse a request: it answers 400 and closes, as uvicorn does."""


class NonceEngine:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except BadRequest as exc:
            self.seen.append({"path": "<unparseable>", "why": str(exc)})
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        try:
            method, target, version = lines[0].decode("latin-1").split(" ")
        except ValueError:
            raise BadRequest(f"request line {lines[0][:80]!r}") from None
        headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise BadRequest(f"header line {line[:80]!r}")
            headers.append((name.decode("latin-1").lower(), value.strip().decode("latin-1")))
        get = dict(headers).get
        if get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await self._body(reader, headers)
        path = target.split("?", 1)[0]
        if method == "GET" and path == "/_seen":
            answer = orjson.dumps(self.seen)
            if "reset=1" in target:
                self.seen = []
            writer.write(_head(200, {"content-type": "application/json", "content-length": str(len(answer))}))
            writer.write(answer)
            await writer.drain()
            return True
        self.seen.append(
            {
                "method": method,
                "path": path,
                "nonce": get("x-nonce"),
                "headers": [name for name, _ in headers],
                "expect": get("expect"),
                "body_len": len(body),
            }
        )
        if method == "GET" and path == "/v1/models":
            answer = orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            writer.write(_head(200, {"content-type": "application/json", "content-length": str(len(answer))}))
            writer.write(answer)
            await writer.drain()
            return True
        return await self._answer(writer, method, path, version, get, body)

    async def _body(self, reader: asyncio.StreamReader, headers: list[tuple[str, str]]) -> bytes:
        codings = [v.lower() for k, v in headers if k == "transfer-encoding"]
        if codings:
            if codings != ["chunked"]:
                raise BadRequest(f"transfer-encoding {codings}")
            parts = []
            while True:
                size_line = await reader.readuntil(b"\r\n")
                try:
                    size = int(size_line.split(b";", 1)[0], 16)
                except ValueError:
                    raise BadRequest(f"chunk size {size_line[:40]!r}") from None
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":
                        pass  # trailers
                    return b"".join(parts)
                parts.append(await reader.readexactly(size))
                if await reader.readexactly(2) != b"\r\n":
                    raise BadRequest("chunk not followed by CRLF")
        lengths = {v for k, v in headers if k == "content-length"}
        if len(lengths) > 1:
            raise BadRequest(f"content-length {sorted(lengths)}")
        return await reader.readexactly(int(lengths.pop())) if lengths else b""

    async def _answer(
        self, writer: asyncio.StreamWriter, method: str, path: str, version: str, get: Any, body: bytes
    ) -> bool:
        nonce = get("x-nonce", "")
        framing = get("x-framing", "length")
        status = int(get("x-status", "200"))
        delay = int(get("x-delay-ms", "0")) / 1000
        summary = {
            "nonce": nonce,
            "method": method,
            "path": path,
            "body_len": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
        }
        pad = max(0, int(get("x-answer-bytes", "0")) - 200)
        payload = orjson.dumps({**summary, "pad": "x" * pad})
        if delay:
            await asyncio.sleep(delay)
        if get("x-interim"):
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </hint>; rel=preload\r\n\r\n")
        keep = version == "HTTP/1.1" and get("connection", "").lower() != "close"
        common = {"x-nonce": nonce, "x-framing": framing}
        if framing == "sse":
            events = [b"data: " + orjson.dumps({**summary, "i": i}) + b"\n\n" for i in range(3)]
            events.append(b"data: " + payload + b"\n\ndata: [DONE]\n\n")
            writer.write(
                _head(status, {**common, "content-type": "text/event-stream", "transfer-encoding": "chunked"})
            )
            for event in events:
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
                await asyncio.sleep(0.002)
            writer.write(b"0\r\n\r\n")
        elif framing == "chunked":
            writer.write(
                _head(
                    status,
                    {
                        **common,
                        "content-type": "application/json",
                        "transfer-encoding": "chunked",
                        "trailer": "x-body-sha256",
                    },
                )
            )
            step = max(1, len(payload) // 3)
            for i in range(0, len(payload), step):
                piece = payload[i : i + step]
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            writer.write(b"0\r\nx-body-sha256: %s\r\n\r\n" % summary["body_sha256"].encode())
        elif framing == "close":
            writer.write(_head(status, {**common, "content-type": "application/json", "connection": "close"}))
            writer.write(payload)
            keep = False
        else:
            head = {**common, "content-type": "application/json", "content-length": str(len(payload))}
            writer.write(_head(status, head))
            writer.write(payload)
        await writer.drain()
        return keep


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b"Status"))]
    lines.extend(f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items())
    lines.append(b"\r\n")
    return b"".join(lines)


def start(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start the engine as a process on a free loopback port (`root`: the repository, for `-m`)."""
    return start_module(root, "tests.support.nonce_engine", "the nonce engine")


def start_module(root: Path, module: str, what: str, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    """Run `python -m MODULE --port N ARGS` (a test engine) on a free loopback port and wait until it
    listens; returns the process and its URL."""
    port = free_port("127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--port", str(port), *args],
        cwd=root,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            return False
        return True

    try:
        wait_until(listening, 20, f"{what} to listen", interval=0.05)
    except AssertionError:
        proc.kill()
        raise
    return proc, f"http://127.0.0.1:{port}"


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)


async def main(port: int) -> None:
    engine = NonceEngine()
    server = await asyncio.start_server(engine.serve, "127.0.0.1", port, limit=1 << 16)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(main(parser.parse_args().port))
