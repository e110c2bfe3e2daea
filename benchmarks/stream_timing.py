"""Per-token timing of streamed OpenAI chat answers, as vLLM's serving benchmark measures it: TTFT is the
arrival of the first event carrying generated text, each later such event adds one inter-token gap (ITL).

`stream_timed` sends one streamed request and keeps the arrival time of every text event; `TimedReport`
gathers a run's requests and gives TTFT, ITL (over all gaps of all requests) and per-request TPOT
quantiles, output tokens/s and failures by kind. Loopback only, like loadgen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from loadgen import JSON_HEADERS, _quantile, check_loopback


@dataclass
class TimedSample:
    ok: bool
    status: int
    latency: float
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)  # seconds between consecutive text events
    completion_tokens: int = 0  # from the final usage event
    error: str = ""

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (vLLM's TPOT), None for one-token answers."""
        if self.ttft is None or self.completion_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.completion_tokens - 1)


def _event_text(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or choice.get("text"):
            return True
    return False


async def stream_timed(
    session: aiohttp.ClientSession, url: str, body: bytes, limits: aiohttp.ClientTimeout
) -> TimedSample:
    """One streamed request, every SSE event parsed as it arrives (a chunk's events share its arrival)."""
    check_loopback(url)
    start = time.perf_counter()
    sample = TimedSample(False, 0, 0.0)
    last: float | None = None
    try:
        async with session.post(url, data=body, headers=JSON_HEADERS, timeout=limits) as resp:
            sample.status = resp.status
            if resp.status != 200:
                await resp.read()
                sample.error = f"status {resp.status}"
                sample.latency = time.perf_counter() - start
                return sample
            pending = b""
            done = False
            async for chunk in resp.content.iter_any():
                now = time.perf_counter()
                pending += chunk
                *events, pending = pending.split(b"\n\n")
                for raw in events:
                    data = raw.strip()
                    if not data.startswith(b"data:"):
                        continue
                    data = data[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        continue
                    event = orjson.loads(data)
                    if "error" in event:
                        sample.error = "error event in stream"
                        continue
                    if event.get("usage"):
                        sample.completion_tokens = int(event["usage"].get("completion_tokens") or 0)
                    if _event_text(event):
                        if last is None:
                            sample.ttft = now - start
                        else:
                            sample.gaps.append(now - last)
                        last = now
            sample.latency = time.perf_counter() - start
            if not done and not sample.error:
                sample.error = "stream ended without [DONE]"
            sample.ok = done and not sample.error and sample.ttft is not None
            return sample
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
        sample.latency = time.perf_counter() - start
        sample.error = type(exc).__name__
        return sample


@dataclass
class TimedReport:
    name: str
    samples: list[TimedSample] = field(default_factory=list)
    wall: float = 0.0

    @property
    def ok(self) -> list[TimedSample]:
        return [s for s in self.samples if s.ok]

    def failures(self) -> dict[str, int]:
        kinds: dict[str, int] = {}
        for s in self.samples:
            if not s.ok:
                kinds[s.error or f"status {s.status}"] = kinds.get(s.error or f"status {s.status}", 0) + 1
        return kinds

    def summary(self) -> dict[str, Any]:
        ok = self.ok
        ttfts = [s.ttft for s in ok if s.ttft is not None]
        gaps = [g for s in ok for g in s.gaps]
        tpots = [t for s in ok if (t := s.tpot) is not None]
        tokens = sum(s.completion_tokens for s in ok)

        def ms(values: list[float], q: float) -> float:
            return round(_quantile(values, q) * 1000, 1)

        return {
            "requests": len(self.samples),
            "failed": len(self.samples) - len(ok),
            "rps": round(len(ok) / self.wall, 2) if self.wall else 0.0,
            "out_tok_s": round(tokens / self.wall, 1) if self.wall else 0.0,
            "ttft_p50_ms": ms(ttfts, 0.5),
            "ttft_p99_ms": ms(ttfts, 0.99),
            "itl_p50_ms": ms(gaps, 0.5),
            "itl_p99_ms": ms(gaps, 0.99),
            "tpot_p50_ms": ms(tpots, 0.5),
            "tpot_p99_ms": ms(tpots, 0.99),
        }
