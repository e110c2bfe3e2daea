"""An engine for the router's wire tests that records every request it is sent, whole: method, target,
headers (names and values) and body; it answers each with a small JSON 200 naming the body's digest.

Parsed with h11, so that what the router sends is read by a third HTTP implementation. Run it as
`python -m tests.support.recording_engine --port N`; `GET /_seen` returns the log (`?reset=1`
empties it after reading), bodies as latin-1 text.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import subprocess
from pathlib import Path
from typing import Any

import h11
import orjson

from tests.support import nonce_engine

MODEL = nonce_engine.MODEL


class RecordingEngine:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 24)
        request: h11.Request | None = None
        body = bytearray()
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(1 << 16)
                    conn.receive_data(data)
                    if not data and conn.their_state is not h11.SEND_BODY:
                        return
                    continue
                if isinstance(event, h11.Request):
                    request, body = event, bytearray()
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage) and request is not None:
                    writer.write(self._answer(conn, request, bytes(body)))
                    await writer.drain()
                    if conn.our_state is h11.MUST_CLOSE:
                        return
                    conn.start_next_cycle()
                elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    return
        except (h11.RemoteProtocolError, h11.LocalProtocolError, ConnectionError):
            return
        finally:
            writer.close()

    def _answer(self, conn: h11.Connection, request: h11.Request, body: bytes) -> bytes:
        target = request.target.decode("latin-1")
        if request.method == b"GET" and target.startswith("/_seen"):
            payload = orjson.dumps(self.seen)
            if "reset=1" in target:
                self.seen = []
        elif request.method == b"GET" and target == "/v1/models":
            payload = orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self.seen.append(
                {
                    "method": request.method.decode("ascii"),
                    "target": target,
                    "headers": [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers],
                    "body": body.decode("latin-1"),
                }
            )
            payload = orjson.dumps({"body_sha256": hashlib.sha256(body).hexdigest()})
        head = conn.send(
            h11.Response(
                status_code=200,
                headers=[("content-type", "application/json"), ("content-length", str(len(payload)))],
            )
        )
        return (
            (head or b"")
            + (conn.send(h11.Data(data=payload)) or b"")
            + (conn.send(h11.EndOfMessage()) or b"")
        )


def start(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start the engine as a process on a free loopback port (`root`: the repository, for `-m`)."""
    return nonce_engine.start_module(root, "tests.support.recording_engine", "the recording engine")


stop = nonce_engine.stop


async def main(port: int) -> None:
    engine = RecordingEngine()
    server = await asyncio.start_server(engine.serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(main(parser.parse_args().port))
