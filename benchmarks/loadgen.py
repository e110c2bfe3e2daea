"""An async HTTP load generator for OpenAI-style endpoints, bounded in count and time.

Two shapes: open loop (requests start at a fixed rate whatever the answers do) and closed loop
(N clients, each sending its next request when the last one ends). Targets are loopback URLs only;
every run stops by itself at `max_requests` or `max_seconds`, whichever comes first.

Usable as a library (`run_open_loop`, `run_closed_loop`) or from the command line:
    python benchmarks/loadgen.py --url http://127.0.0.1:8000 --model sim-model --rate 200 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import aiohttp
import orjson

LOOPBACK_HOSTS = {"localhost", "::1"}


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    if host not in LOOPBACK_HOSTS and not host.startswith("127."):
        raise SystemExit(f"loadgen: refusing to send load to {url}: only loopback (127.0.0.0/8) is allowed")


def exit_on_sigterm() -> None:
    """SIGTERM ends the benchmark as Ctrl-C does (SystemExit in the main thread), so its `finally` stops
    the engines and routers it started instead of leaving them running without a parent."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


@dataclass
class Sample:
    ok: bool
    latency: float
    ttft: float | None
    status: int
    error: str = ""


@dataclass
class Report:
    name: str
    samples: list[Sample] = field(default_factory=list)
    wall: float = 0.0

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    @property
    def errors(self) -> int:
        return sum(1 for s in self.samples if not s.ok)

    @property
    def rps(self) -> float:
        return len(self.ok) / self.wall if self.wall else 0.0

    def latency_ms(self, q: float) -> float:
        return _quantile([s.latency for s in self.ok], q) * 1000

    def ttft_ms(self, q: float) -> float:
        values = [s.ttft for s in self.ok if s.ttft is not None]
        return _quantile(values, q) * 1000 if values else float("nan")

    def error_kinds(self) -> dict[str, int]:
        kinds: dict[str, int] = {}
        for s in self.samples:
            if not s.ok:
                key = s.error or f"status {s.status}"
                kinds[key] = kinds.get(key, 0) + 1
        return kinds

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "requests": len(self.samples),
            "errors": self.errors,
            "rps": round(self.rps, 1),
            "p50_ms": round(self.latency_ms(0.5), 2),
            "p99_ms": round(self.latency_ms(0.99), 2),
            "ttft_p50_ms": round(self.ttft_ms(0.5), 2),
            "ttft_p99_ms": round(self.ttft_ms(0.99), 2),
        }


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=1000, method="inclusive")[min(998, max(0, int(q * 1000) - 1))]


def chat_body(model: str, stream: bool, max_tokens: int, i: int) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": f"Request {i}: tell me a short story about the sea."}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


BodyFactory = Callable[[int], bytes]


JSON_HEADERS = {"Content-Type": "application/json"}


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    stream: bool,
    limits: aiohttp.ClientTimeout,
    headers: Mapping[str, str] = JSON_HEADERS,
) -> Sample:
    start = time.perf_counter()
    ttft: float | None = None
    try:
        async with session.post(url, data=body, headers=headers, timeout=limits) as resp:
            if stream:
                saw_done = False
                error = ""
                async for chunk in resp.content.iter_any():
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    if b'"error"' in chunk:
                        error = "error event in stream"
                    if b"data: [DONE]" in chunk:
                        saw_done = True
                ok = resp.status == 200 and saw_done and not error
                if not saw_done and not error:
                    error = "stream ended without [DONE]"
                return Sample(ok, time.perf_counter() - start, ttft, resp.status, error)
            await resp.read()
            return Sample(resp.status == 200, time.perf_counter() - start, None, resp.status)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Sample(False, time.perf_counter() - start, ttft, 0, type(exc).__name__)


def _session(concurrency: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency, force_close=False))


async def run_open_loop(
    name: str,
    urls: Sequence[str],
    body_for: BodyFactory,
    rate: float,
    max_requests: int,
    max_seconds: float,
    stream: bool = False,
    request_timeout: float = 30.0,
    headers: Mapping[str, str] = JSON_HEADERS,
) -> Report:
    """Start a request every 1/rate seconds (round-robin over `urls`), bounded by count and time."""
    for u in urls:
        check_loopback(u)
    report = Report(name)
    timeout = aiohttp.ClientTimeout(total=request_timeout)
    targets = itertools.cycle(urls)
    async with _session(max(64, int(rate))) as session:
        tasks: list[asyncio.Task[Sample]] = []
        start = time.perf_counter()
        for i in range(max_requests):
            due = start + i / rate
            if due - start > max_seconds:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(
                asyncio.create_task(_one(session, next(targets), body_for(i), stream, timeout, headers))
            )
        report.samples = list(await asyncio.gather(*tasks))
        report.wall = time.perf_counter() - start
    return report


async def run_closed_loop(
    name: str,
    urls: Sequence[str],
    body_for: BodyFactory,
    clients: int,
    max_requests: int,
    max_seconds: float,
    stream: bool = False,
    request_timeout: float = 30.0,
    headers: Mapping[str, str] = JSON_HEADERS,
) -> Report:
    """`clients` workers send back-to-back requests until `max_requests` or `max_seconds`."""
    for u in urls:
        check_loopback(u)
    report = Report(name)
    timeout = aiohttp.ClientTimeout(total=request_timeout)
    counter = itertools.count()
    async with _session(clients) as session:
        start = time.perf_counter()
        deadline = start + max_seconds

        async def worker(k: int) -> None:
            while time.perf_counter() < deadline:
                i = next(counter)
                if i >= max_requests:
                    return
                url = urls[i % len(urls)]
                report.samples.append(await _one(session, url, body_for(i), stream, timeout, headers))

        await asyncio.gather(*(worker(k) for k in range(clients)))
        report.wall = time.perf_counter() - start
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--url", action="append", required=True, help="base URL (repeatable)")
    parser.add_argument("--model", default="sim-model")
    parser.add_argument("--rate", type=float, help="open loop: requests per second")
    parser.add_argument("--clients", type=int, help="closed loop: concurrent clients")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    urls = [u.rstrip("/") + "/v1/chat/completions" for u in args.url]

    def body_for(i: int) -> bytes:
        return chat_body(args.model, args.stream, args.max_tokens, i)

    if args.rate:
        coro = run_open_loop("open", urls, body_for, args.rate, args.max_requests, args.seconds, args.stream)
    else:
        clients = args.clients or 64
        coro = run_closed_loop(
            "closed", urls, body_for, clients, args.max_requests, args.seconds, args.stream
        )
    report = asyncio.run(coro)
    print(orjson.dumps(report.summary()).decode())
    if report.errors:
        print("errors:", report.error_kinds())


if __name__ == "__main__":
    main()
