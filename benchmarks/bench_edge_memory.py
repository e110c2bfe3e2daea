"""What a client can make the router hold in memory behind a slow request (issue 27, finding 2): the
router's RSS (psutil) before and after each attack, on its lean server side and on aiohttp's, in the
same run, in front of the nonce engine (tests/support/nonce_engine.py), both routers with
--max-body-size 4MiB.

Attacks, each on one connection whose first request is an inference POST the engine answers late
(x-delay-ms), the rest pipelined behind it and sent in 64 KiB writes until the router stops reading
(no write progress for --stall seconds) or all is sent:

  handoff:   a POST to a path the router does not serve (aiohttp's) with a 512 MiB body;
  pipelined: 16 inference POSTs with 4 MiB bodies.

    .venv/bin/python benchmarks/bench_edge_memory.py [--handoff-mib 512] [--stall 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support import nonce_engine  # noqa: E402
from tests.support.procs import CorralProcess, free_port  # noqa: E402

MIB = 1024 * 1024
PIECE = 64 * 1024


def slow_inference(delay_ms: int) -> bytes:
    body = b'{"model": "nonce-model", "prompt": "slow"}'
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"x-delay-ms: %d\r\nContent-Length: %d\r\n\r\n%s" % (delay_ms, len(body), body)
    )


def send_until_stalled(sock: socket.socket, head: bytes, parts: list[tuple[bytes, int]], stall: float) -> int:
    """Send `head`, then each (part head, body bytes) pair; return the bytes the router took."""
    sock.settimeout(stall)
    sent = 0
    piece = b"x" * PIECE
    try:
        sock.sendall(head)
        sent += len(head)
        for part_head, body in parts:
            sock.sendall(part_head)
            sent += len(part_head)
            left = body
            while left:
                n = sock.send(piece[: min(PIECE, left)])
                sent += n
                left -= n
    except (TimeoutError, OSError):
        pass
    return sent


def rss(pid: int) -> int:
    """The router's resident memory: the process and its children (the router may run in one)."""
    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])


def attack(port: int, pid: int, name: str, args: argparse.Namespace) -> dict[str, float]:
    before = rss(pid)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 * 1024)
    head = slow_inference(args.delay_ms)
    if name == "handoff":
        size = args.handoff_mib * MIB
        parts = [
            (
                b"POST /not-served HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size,
                size,
            )
        ]
    else:
        size = 4 * MIB - 64
        parts = [
            (
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % size,
                size,
            )
            for _ in range(16)
        ]
    start = time.monotonic()
    sent = send_until_stalled(sock, head, parts, args.stall)
    after = rss(pid)
    sock.close()
    return {
        "sent_mib": sent / MIB,
        "rss_before_mib": before / MIB,
        "rss_after_mib": after / MIB,
        "grown_mib": (after - before) / MIB,
        "seconds": time.monotonic() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--handoff-mib", type=int, default=512)
    parser.add_argument("--stall", type=float, default=2.0, help="seconds without write progress: stopped")
    parser.add_argument("--delay-ms", type=int, default=120_000)
    args = parser.parse_args()
    engine, engine_url = nonce_engine.start(ROOT)
    routers: dict[str, tuple[CorralProcess, int]] = {}
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
                    "--max-body-size",
                    "4MiB",
                    "--body-timeout",
                    "0",
                    "--workers",
                    "1",
                    "--http-server",
                    server,
                ]
            )
            routers[server] = (proc, port)
            proc.wait_http(f"http://127.0.0.1:{port}/health")
        print(f"python {sys.version.split()[0]}, PYTHONPATH={os.environ.get('PYTHONPATH', '') or '(unset)'}")
        print(
            f"{'attack':<10} {'server':<8} {'sent MiB':>9} {'RSS before':>11} {'RSS after':>10} "
            f"{'grown MiB':>10}"
        )
        for name in ("handoff", "pipelined"):
            for server, (proc, port) in routers.items():
                got = attack(port, proc.pid, name, args)
                print(
                    f"{name:<10} {server:<8} {got['sent_mib']:>9.1f} {got['rss_before_mib']:>11.1f} "
                    f"{got['rss_after_mib']:>10.1f} {got['grown_mib']:>10.1f}"
                )
    finally:
        for proc, _ in routers.values():
            proc.stop()
        nonce_engine.stop(engine)


if __name__ == "__main__":
    main()
