"""A prototype, for benchmarks only: the router's proxy path served by a lean HTTP/1.1 server protocol
on httptools instead of aiohttp's server, to price what a server swap would save.

It does the per-request work the real proxy path cannot skip — parse the head and the JSON body (to
read `model`), drop hop-by-hop headers, name the request, pick an engine (round robin), forward with
Corral's own upstream client, relay the answer (whole, or SSE as chunked) with keep-alive — and none of
the edge (no client limits, tenants, admin access, metrics, retries). So it is a floor, not a router:
    python benchmarks/lean_server_prototype.py --port 8080 --backend http://127.0.0.1:8001
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections import deque

import httptools
import orjson
import uvloop

from corral.router.datapath.proxy import HOP_BY_HOP, RESPONSE_SKIP
from corral.router.datapath.request_ids import RequestIds
from corral.router.datapath.upstream import UPSTREAM_FAILURES, UpstreamClient

Request = tuple[str, str, list[tuple[str, str]], bytes, bool]
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 502: "Bad Gateway"}


class Router:
    def __init__(self, backends: list[str]) -> None:
        self.upstream = UpstreamClient(connect_timeout=5.0, read_timeout=300.0)
        self.next_backend = itertools.cycle(backends).__next__
        self.ids = RequestIds()


class LeanConnection(asyncio.Protocol):
    """One client connection: requests parsed by llhttp, answered in order (pipelining kept)."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.queue: deque[Request] = deque()
        self.busy = False
        self.url = b""
        self.headers: list[tuple[str, str]] = []
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.write_whole(400, [], b'{"error":"bad request"}', keep_alive=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", [], []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        parser = self.parser
        method = parser.get_method().decode("ascii")
        url, keep_alive = self.url.decode("latin-1"), parser.should_keep_alive()
        self.queue.append((method, url, self.headers, b"".join(self.body), keep_alive))
        if not self.busy:
            self.busy = True
            asyncio.get_running_loop().create_task(self.serve())

    async def serve(self) -> None:
        try:
            while self.queue and self.transport is not None:
                if not await self.answer(*self.queue.popleft()):
                    return
        finally:
            self.busy = False

    async def answer(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes, keep_alive: bool
    ) -> bool:
        if method == "GET":  # the benchmark's readiness probe
            return self.write_whole(200, [("Content-Type", "application/json")], b"{}", keep_alive)
        try:
            payload = orjson.loads(body)
            model = payload.get("model") if isinstance(payload, dict) else None
        except orjson.JSONDecodeError:
            model = None
        if not isinstance(model, str):
            return self.write_whole(400, [], b'{"error":"no model"}', keep_alive)
        request_id = self.router.ids.new()
        forwarded = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]
        forwarded.append(("X-Request-Id", request_id))
        try:
            upstream = await self.router.upstream.request(
                self.router.next_backend(), method, path, forwarded, body
            )
        except UPSTREAM_FAILURES:
            return self.write_whole(502, [], b'{"error":"engine failed"}', keep_alive)
        try:
            answer = [(k, v) for k, v in upstream.headers if k.lower() not in RESPONSE_SKIP]
            answer.append(("X-Request-Id", request_id))
            if upstream.content_type != "text/event-stream":
                return self.write_whole(upstream.status, answer, await upstream.read(), keep_alive)
            transport = self.transport
            if transport is None:
                return False
            transport.write(head(upstream.status, answer, "Transfer-Encoding: chunked", keep_alive))
            while chunk := await upstream.readany():
                if self.transport is None:
                    return False
                self.transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            if self.transport is None:
                return False
            self.transport.write(b"0\r\n\r\n")
            return self.finish(keep_alive)
        finally:
            upstream.close()

    def write_whole(self, status: int, headers: list[tuple[str, str]], body: bytes, keep_alive: bool) -> bool:
        if self.transport is None:
            return False
        self.transport.write(head(status, headers, f"Content-Length: {len(body)}", keep_alive) + body)
        return self.finish(keep_alive)

    def finish(self, keep_alive: bool) -> bool:
        if not keep_alive and self.transport is not None:
            self.transport.close()
        return keep_alive


def head(status: int, headers: list[tuple[str, str]], framing: str, keep_alive: bool) -> bytes:
    lines = "".join([f"{k}: {v}\r\n" for k, v in headers])
    connection = "" if keep_alive else "Connection: close\r\n"
    reason = REASONS.get(status, "Unknown")
    return f"HTTP/1.1 {status} {reason}\r\n{lines}{framing}\r\n{connection}\r\n".encode("latin-1")


async def serve(host: str, port: int, backends: list[str]) -> None:
    router = Router(backends)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: LeanConnection(router), host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", action="append", required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port, args.backend))


if __name__ == "__main__":
    main()
