"""A raw HTTP/1.1 engine that answers inference POSTs the way a compromised or broken engine would, for the
router's tests of what it accepts from engines (issue 27). It serves `/v1/models`, `/version` and
`/health` as vLLM does (so the router routes to it and pairs two of them for P/D), records each POST's
JSON body (`GET /_bodies` returns them), and answers the POST as the request's `x-hostile` header says, or
as `--mode` says when the header is absent:

  plain      a normal completion, `"kv_transfer_params": null` (what vLLM answers)
  leaky      params naming an engine id, a side-channel host/port and block ids, in a whole answer and,
             with `"stream": true`, in an SSE event
  huge       a valid JSON answer of `x-bytes` bytes (default 70 MiB), sent chunked 1 MiB at a time
  not-json   a 200 whose body is not JSON
  long-line  an SSE answer whose first line runs `x-bytes` bytes before its newline (default 3 MiB),
             then [DONE]; with `x-key: 1` the line ends with leaky params
  cut        an SSE answer cut (the connection closed) after one event
  close      the connection closed after the request, no answer at all

Run it as `python -m tests.support.hostile_engine --port N [--mode M]`.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
from pathlib import Path
from typing import Any

import orjson

from tests.support import nonce_engine

MODEL = "hostile-model"
VERSION = "0.32.0"
LEAKED_HOST = "10.9.8.7"  # what leaky params name: a client must never see it
LEAKED_ENGINE = "engine-secret-id"
PARAMS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": LEAKED_ENGINE,
    "remote_request_id": "r-1",
    "remote_host": LEAKED_HOST,
    "remote_port": 5600,
    "remote_block_ids": [[1, 2, 3]],
    "tp_size": 1,
}
MIB = 1 << 20


def completion(params: dict[str, Any] | None, pad: int = 0) -> bytes:
    body: dict[str, Any] = {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": MODEL,
        "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        "kv_transfer_params": params,
    }
    if pad:
        body["pad"] = "x" * pad
    return orjson.dumps(body)


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class HostileEngine:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.bodies: list[Any] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        method, target, _ = lines[0].decode("latin-1").split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.decode("latin-1").strip().lower()] = value.strip().decode("latin-1")
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        path = target.split("?", 1)[0]
        if method == "GET":
            pages: dict[str, Any] = {
                "/v1/models": {"object": "list", "data": [{"id": MODEL, "object": "model", "root": MODEL}]},
                "/version": {"version": VERSION},
                "/health": {},
                "/_bodies": self.bodies,
            }
            page = pages.get(path)
            await self._whole(writer, 200 if page is not None else 404, orjson.dumps(page or {}))
            return True
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            request = None
        self.bodies.append(request)
        mode = headers.get("x-hostile", self.mode)
        size = int(headers.get("x-bytes", "0"))
        stream = isinstance(request, dict) and request.get("stream") is True
        if mode == "close":
            return False
        if mode == "not-json":
            await self._whole(writer, 200, b"<html>not json</html>")
        elif mode == "huge":
            await self._huge(writer, size or 70 * MIB)
        elif mode == "long-line":
            tail = b', "kv_transfer_params": ' + orjson.dumps(PARAMS) if headers.get("x-key") else b""
            line = b'data: {"pad": "' + b"x" * (size or 3 * MIB) + b'"' + tail + b"}\n\n"
            await self._sse(writer, [line[i : i + 64 * 1024] for i in range(0, len(line), 64 * 1024)])
        elif mode == "cut":
            writer.write(_head(200, {"content-type": "text/event-stream", "transfer-encoding": "chunked"}))
            first = event({"choices": [{"index": 0, "text": "a"}]})
            writer.write(b"%x\r\n%s\r\n" % (len(first), first))
            await writer.drain()
            return False
        elif mode == "leaky" and stream:
            await self._sse(
                writer,
                [
                    event({"choices": [{"index": 0, "text": "a"}]}),
                    event({"choices": [], "kv_transfer_params": PARAMS}),
                    b"data: [DONE]\n\n",
                ],
            )
        elif mode == "leaky":
            await self._whole(writer, 200, completion(PARAMS))
        elif stream:
            await self._sse(writer, [event({"choices": [{"index": 0, "text": "a"}]}), b"data: [DONE]\n\n"])
        else:
            await self._whole(writer, 200, completion(None))
        return True

    async def _whole(self, writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        writer.write(_head(status, {"content-type": "application/json", "content-length": str(len(body))}))
        writer.write(body)
        await writer.drain()

    async def _sse(self, writer: asyncio.StreamWriter, pieces: list[bytes]) -> None:
        writer.write(_head(200, {"content-type": "text/event-stream", "transfer-encoding": "chunked"}))
        for piece in pieces:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _huge(self, writer: asyncio.StreamWriter, size: int) -> None:
        writer.write(_head(200, {"content-type": "application/json", "transfer-encoding": "chunked"}))
        body = completion(None, pad=size)
        for i in range(0, len(body), MIB):
            piece = body[i : i + MIB]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [b"HTTP/1.1 %d Status\r\n" % status]
    lines.extend(f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items())
    lines.append(b"\r\n")
    return b"".join(lines)


def start(mode: str = "plain") -> tuple[subprocess.Popen[bytes], str]:
    """Start the engine as a process on a free loopback port; returns it and its URL."""
    root = Path(__file__).resolve().parents[2]
    return nonce_engine.start_module(
        root, "tests.support.hostile_engine", "the hostile engine", "--mode", mode
    )


stop = nonce_engine.stop


async def main(port: int, mode: str) -> None:
    engine = HostileEngine(mode)
    server = await asyncio.start_server(engine.serve, "127.0.0.1", port, limit=1 << 20)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", default="plain")
    args = parser.parse_args()
    asyncio.run(main(args.port, args.mode))
