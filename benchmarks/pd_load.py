"""bench_pd's load: the request shapes every fleet gets (long shared-nothing prompts, long outputs,
streamed), the closed loop that sends them, and the interference probe that asks one engine whether a long
prefill slows the decodes running beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from corral.engine.sim_tokenizer import WORDS
from stream_timing import TimedReport, stream_timed

MODEL = "bench-model"


@dataclass(frozen=True)
class Shape:
    prompt_words: int
    max_tokens: int


class Workload:
    """The request shapes (the same for every fleet) and each fleet's own prompt text."""

    def __init__(self, args: argparse.Namespace) -> None:
        rng = random.Random(args.seed)
        self.shapes = [
            Shape(rng.randint(args.prompt_min, args.prompt_max), rng.randint(args.out_min, args.out_max))
            for _ in range(args.max_requests)
        ]

    def body(self, i: int, salt: int, max_tokens: int | None = None) -> bytes:
        shape = self.shapes[i % len(self.shapes)]
        words = random.Random(salt * 1_000_003 + i).choices(WORDS, k=shape.prompt_words)
        return orjson.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Request {salt}-{i}: " + " ".join(words)}],
                "max_tokens": max_tokens or shape.max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )


async def closed_loop(
    name: str,
    url: str,
    work: Workload,
    salt: int,
    clients: int,
    max_requests: int,
    seconds: float,
    max_tokens: int | None = None,
) -> TimedReport:
    """`clients` workers send back-to-back streamed requests until `max_requests` or `seconds` (every
    request asking for `max_tokens` when given: the warm-up)."""
    report = TimedReport(name)
    counter = itertools.count()
    limits = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        deadline = start + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                i = next(counter)
                if i >= max_requests:
                    return
                body = work.body(i, salt, max_tokens)
                report.samples.append(await stream_timed(session, url, body, limits))

        await asyncio.gather(*(worker() for _ in range(clients)))
        report.wall = time.perf_counter() - start
    return report


async def interference_probe(url: str, prompt_words: int, prefills: int) -> dict[str, Any]:
    """Does a long prefill slow an engine's running decodes (the reason for P/D)? One decode stream (short
    prompt, 128 tokens) alone, then again while `prefills` clients keep sending `prompt_words`-word
    prompts for one token each; its ITL p50/p99 both times. About 1.0 loaded/alone: the engine's latency
    model does not couple them, and disaggregation cannot win on ITL here."""
    rng = random.Random(7)
    limits = aiohttp.ClientTimeout(total=120)

    def body(words: int, max_tokens: int) -> bytes:
        text = " ".join(rng.choices(WORDS, k=words))
        return orjson.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
            }
        )

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        alone = TimedReport("alone", [await stream_timed(session, url, body(64, 128), limits)])
        done = asyncio.Event()

        async def prefill_client() -> None:
            while not done.is_set():
                await stream_timed(session, url, body(prompt_words, 1), limits)

        clients = [asyncio.create_task(prefill_client()) for _ in range(prefills)]
        await asyncio.sleep(0.2)
        loaded = TimedReport("loaded", [await stream_timed(session, url, body(64, 128), limits)])
        done.set()
        await asyncio.gather(*clients)
    a, b = alone.summary(), loaded.summary()
    return {
        "itl_p50_ms_alone": a["itl_p50_ms"],
        "itl_p99_ms_alone": a["itl_p99_ms"],
        "itl_p50_ms_with_prefills": b["itl_p50_ms"],
        "itl_p99_ms_with_prefills": b["itl_p99_ms"],
        "p50_ratio": round(b["itl_p50_ms"] / a["itl_p50_ms"], 3) if a["itl_p50_ms"] else None,
    }
