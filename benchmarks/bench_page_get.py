"""What one `/metrics` scrape costs the router's process: Corral's lean GET (`corral.engine.page_get`)
against aiohttp's client, on a new connection each time and on a kept-alive one, in the same run.

One fake engine (benchmarks/scale_fleet.py: a real vLLM 54 KB `/metrics` page from
tests/data/vllm-samples) runs in its own process on CPU 1 when there are two; this process, on CPU 0,
GETs the page `--gets` times per round with each client, the clients alternating round by round, and
prints the best round's CPU time of this process per GET (body read whole, not parsed) and the ratio
to the lean GET on a new connection. Loopback only, bounded in count.

    .venv/bin/python benchmarks/bench_page_get.py [--gets 500] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corral.engine.page_get import PageClient
from scale_fleet import start_engines

Get = Callable[[], Awaitable[bytes]]


async def measure(gets: int, rounds: int, url: str) -> dict[str, float]:
    lean_new = PageClient(timeout=5.0, keepalive=0)
    lean_kept = PageClient(timeout=5.0)
    fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
    kept = aiohttp.ClientSession()

    async def aiohttp_get(session: aiohttp.ClientSession) -> bytes:
        async with session.get(url + "/metrics") as resp:
            return await resp.read()

    async def lean_get(client: PageClient) -> bytes:
        status, body = await client.get(url, "/metrics")
        assert status == 200
        return body

    clients: dict[str, Get] = {
        "lean GET, new connection": lambda: lean_get(lean_new),
        "lean GET, kept alive": lambda: lean_get(lean_kept),
        "aiohttp, new connection": lambda: aiohttp_get(fresh),
        "aiohttp, kept alive": lambda: aiohttp_get(kept),
    }
    best = dict.fromkeys(clients, float("inf"))
    try:
        for _ in range(rounds):
            for name, get in clients.items():
                size = len(await get())  # warm: the connection, the page
                start = time.process_time()
                for _ in range(gets):
                    if len(await get()) != size:
                        raise SystemExit(f"{name}: the page changed size mid-run")
                best[name] = min(best[name], (time.process_time() - start) / gets * 1e3)
    finally:
        lean_new.close()
        lean_kept.close()
        await fresh.close()
        await kept.close()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gets", type=int, default=500, help="GETs per client per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the best is reported")
    args = parser.parse_args()
    two = (os.cpu_count() or 1) >= 2
    with tempfile.TemporaryDirectory(prefix="bench-page-get-") as out:
        engine, urls, _ = start_engines(1, Path(out), {1} if two else set())
        try:
            if two:
                os.sched_setaffinity(0, {0})
            best = uvloop.run(measure(args.gets, args.rounds, urls[0]))
        finally:
            engine.stop()
    base = best["lean GET, new connection"]
    print(
        f"CPU ms of this process per /metrics GET (54 KB page), best of {args.rounds} rounds of {args.gets}"
    )
    for name, ms in best.items():
        print(f"  {name:26} {ms:7.3f} ms   {ms / base:5.2f}x")


if __name__ == "__main__":
    main()
