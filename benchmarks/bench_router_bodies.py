"""Router memory under large request bodies: several clients at once each send a body far over
--max-body-size, first with a Content-Length (as curl sends a file), then chunked; the router's
peak resident memory (VmHWM) and its answers are reported for each. With the limits the declared
bodies are refused before they are read, and a chunked one is cut as it grows past the limit, so the
peak is bounded by --max-in-flight x --max-body-size instead of by what clients send.

    .venv/bin/python benchmarks/bench_router_bodies.py [--clients 8] [--mb 50]
        [--router-arg=--max-body-size=8MiB]

Everything runs on loopback and stops by itself.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

from bench_router import ROOT, free_port, spawn, wait_ready


def peak_rss_mib(pid: int) -> tuple[float, float]:
    """(VmHWM, VmRSS) of the process, in MiB."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmHWM"], values["VmRSS"]


def send_body(port: int, size: int, chunked: bool, answers: list[str]) -> None:
    piece = b'{"model":"sim-model","prompt":"' + b"a" * (1 << 20)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
    head += b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"Content-Length: %d\r\n\r\n" % size
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as s:
        try:
            s.sendall(head)
            while sent < size:
                part = piece[: min(len(piece), size - sent)]
                s.sendall(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
                sent += len(part)
            if chunked:
                s.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the router answered and closed before the whole body: what the limit is for
        s.settimeout(30)
        try:
            status = s.recv(64).split(b"\r\n", 1)[0].decode(errors="replace")
        except OSError as exc:
            status = type(exc).__name__
    answers.append(status or "closed without an answer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--mb", type=int, default=50, help="each body's size, in MB (10^6 bytes)")
    parser.add_argument("--router-arg", action="append", default=[], help="extra `corral router` flag")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/out"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    sim_port, port = free_port(), free_port()
    sim = spawn(
        "sim",
        [sys.executable, "-m", "corral", "sim", "--port", str(sim_port)],
        f"http://127.0.0.1:{sim_port}",
        None,
        out,
    )
    flags = [arg for extra in args.router_arg for arg in extra.split("=", 1)]
    router_argv = [
        sys.executable,
        "-m",
        "corral",
        "router",
        "--workers",
        "1",
        "--port",
        str(port),
        "--backend",
        sim.url,
        *flags,
    ]
    router = spawn("router", router_argv, f"http://127.0.0.1:{port}", None, out)
    try:
        wait_ready(sim, "/health")
        wait_ready(router, "/health")
        print(f"router at rest: peak {peak_rss_mib(router.popen.pid)[0]:.0f} MiB")
        for chunked in (False, True):
            answers: list[str] = []
            threads = [
                threading.Thread(target=send_body, args=(port, args.mb * 1_000_000, chunked, answers))
                for _ in range(args.clients)
            ]
            start = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            hwm, rss = peak_rss_mib(router.popen.pid)
            how = "chunked" if chunked else "Content-Length"
            print(
                f"{args.clients} x {args.mb} MB, {how}: router peak {hwm:.0f} MiB (now {rss:.0f} MiB), "
                f"{time.monotonic() - start:.1f} s, answers {sorted(set(answers))}"
            )
    finally:
        router.stop()
        sim.stop()


if __name__ == "__main__":
    main()
