"""What the lean server holds behind a slow answer (issue 27, finding 2): the bytes of requests parsed
ahead of the request being answered, and those waiting for the hand-off to aiohttp, stay under
HELD_AHEAD (+ one socket read); past it the router stops reading and the rest waits in the client's
socket. Measured on a real router process (psutil) with a client that writes until the router
stops taking bytes.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.support import nonce_engine
from tests.support.procs import CorralProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
ATTACK = 96 * MIB  # what the client tries to make the router hold
BOUND = 24 * MIB  # 4 MiB --max-body-size + 1 MiB held ahead + socket buffers, with room to spare


@dataclass(frozen=True)
class Router:
    port: int
    pid: int


@pytest.fixture(scope="module")
def router() -> Iterator[Router]:
    engine, engine_url = nonce_engine.start(ROOT)
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
            "--http-server",
            "lean",
            "--workers",
            "1",
            "--max-body-size",
            "4MiB",
            "--body-timeout",
            "0",
        ]
    )
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health")
        yield Router(port, proc.pid)
    finally:
        proc.stop()
        nonce_engine.stop(engine)


def slow_inference() -> bytes:
    body = b'{"model": "nonce-model", "prompt": "slow"}'
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"x-delay-ms: 60000\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )


def taken(port: int, behind: list[tuple[bytes, int]]) -> int:
    """Send a slow request, then `behind` (heads and body sizes); the bytes the router took before it
    stopped reading (2 s without progress) or all of them."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 * 1024)
    sock.settimeout(2.0)
    sent = 0
    piece = b"x" * (64 * 1024)
    try:
        sock.sendall(slow_inference())
        for head, size in behind:
            sock.sendall(head)
            sent += len(head)
            while size:
                n = sock.send(piece[: min(len(piece), size)])
                sent, size = sent + n, size - n
    except (TimeoutError, OSError):
        pass
    finally:
        sock.close()
    return sent


def rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def test_a_large_body_for_aiohttp_behind_a_slow_answer_is_not_buffered(router: Router) -> None:
    before = rss(router.pid)
    head = b"POST /not-served HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % ATTACK
    sent = taken(router.port, [(head, ATTACK)])
    grown = rss(router.pid) - before
    print(f"\nhand-off behind a slow answer: router took {sent / MIB:.1f} MiB, RSS +{grown / MIB:.1f} MiB")
    assert sent < BOUND and grown < BOUND, (sent, grown)


def test_pipelined_inference_bodies_behind_a_slow_answer_are_bounded_in_bytes(router: Router) -> None:
    before = rss(router.pid)
    size = 4 * MIB - 64
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % size
    )
    sent = taken(router.port, [(head, size)] * 16)
    grown = rss(router.pid) - before
    print(
        f"\n16 pipelined 4 MiB bodies behind a slow answer: router took {sent / MIB:.1f} MiB, "
        f"RSS +{grown / MIB:.1f} MiB"
    )
    assert sent < BOUND and grown < BOUND, (sent, grown)
