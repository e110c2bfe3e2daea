"""Engine-metrics parsing on the router's scrape path: what reading the routing gauges (requests running
and waiting, KV-cache usage, LoRA adapters running) from one `/metrics` answer costs, three ways, in one
process, interleaved in rounds:

    hand        the byte-level scan the router used before `corral.engine.metrics_text` (copied here)
    engine      `corral.router.routing.load_scraper.parse_engine_metrics`, on `corral.engine.metrics_text`
    prometheus  prometheus_client's `text_string_to_metric_families`, as four other modules used it

on a real vLLM page (tests/data/vllm-samples/metrics.body) and on the same page as a data-parallel
engine of `--dp` ranks would answer it. Printed: microseconds per parse (median of rounds), ratio to hand.

    .venv/bin/python benchmarks/bench_metrics_text.py [--dp 8] [--rounds 7] [--seconds 0.3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from corral.engine import metric_names as m
from corral.router.routing.load_board import EngineLoad
from corral.router.routing.load_scraper import parse_engine_metrics

REAL = Path(__file__).parents[1] / "tests" / "data" / "vllm-samples" / "metrics.body"
_NAMES = (m.RUNNING.encode(), m.WAITING.encode(), m.KV_USAGE.encode(), m.LORA_INFO.encode())


def hand(text: bytes, now: float) -> EngineLoad:
    load = EngineLoad(at=now)
    adapters: frozenset[str] = frozenset()
    latest_lora = -1.0
    for line in text.split(b"\n"):
        if not line.startswith(b"vllm:"):
            continue
        name_end = line.find(b"{")
        if name_end < 0:
            name_end = line.find(b" ")
        name = line[:name_end]
        if name not in _NAMES:
            continue
        try:
            value = float(line[line.rindex(b" ") + 1 :])
        except ValueError:
            continue
        if name == _NAMES[0]:
            load.running += value
        elif name == _NAMES[1]:
            load.waiting += value
        elif name == _NAMES[2]:
            load.kv_usage = max(load.kv_usage, value)
        elif value > latest_lora:
            latest_lora = value
            start = line.find(b'running_lora_adapters="')
            if start >= 0:
                start += len('running_lora_adapters="')
                end = line.find(b'"', start)
                adapters = frozenset(a for a in line[start:end].decode().split(",") if a)
    load.running_adapters = adapters
    return load


def prometheus(text: bytes, now: float) -> EngineLoad:
    load = EngineLoad(at=now)
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name == m.RUNNING:
                load.running += s.value
            elif s.name == m.WAITING:
                load.waiting += s.value
            elif s.name == m.KV_USAGE:
                load.kv_usage = max(load.kv_usage, s.value)
    return load


def data_parallel(page: str, ranks: int) -> bytes:
    """The page with every `engine="0"` sample repeated for ranks 0..ranks-1."""
    lines: list[str] = []
    for line in page.split("\n"):
        if 'engine="0"' in line:
            lines.extend(line.replace('engine="0"', f'engine="{r}"') for r in range(ranks))
        else:
            lines.append(line)
    lora = 'vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,chat",waiting_lora_adapters=""}'
    lines.append(lora + " 1.7e9")
    return "\n".join(lines).encode()


def per_call_us(fn: Callable[[bytes, float], EngineLoad], text: bytes, seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(20):
            fn(text, 1.0)
        n += 20
    return elapsed / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dp", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.3)
    args = ap.parse_args()
    page = REAL.read_text()
    pages = {"real (1 engine)": page.encode(), f"real x dp={args.dp}": data_parallel(page, args.dp)}
    ways: dict[str, Callable[[bytes, float], EngineLoad]] = {
        "hand": hand,
        "engine": parse_engine_metrics,
        "prometheus": prometheus,
    }
    for label, text in pages.items():
        a, b = hand(text, 1.0), parse_engine_metrics(text, 1.0)
        assert (a.running, a.waiting, a.kv_usage, a.running_adapters) == (
            b.running,
            b.waiting,
            b.kv_usage,
            b.running_adapters,
        ), label
        times: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(args.rounds):
            for way, fn in ways.items():
                times[way].append(per_call_us(fn, text, args.seconds))
        base = statistics.median(times["hand"])
        print(f"{label}: {len(text)} bytes, {len(text.splitlines())} lines")
        for way in ways:
            med = statistics.median(times[way])
            print(f"  {way:<11} {med:9.1f} us/parse  {med / base:5.2f}x hand")


if __name__ == "__main__":
    main()
