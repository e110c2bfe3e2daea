"""What the router's chart history costs: one tick (`FleetHistory.sample`, every 5 s from the router's
start) at 10, 100 and 1,000 endpoints, against serializing the same fleet view once (`orjson.dumps`,
what the dashboard feed does at each of its reads, every 0.5 s while a dashboard is open), timed in
the same process and interleaved in rounds; and the memory the history holds after a full span
(180 ticks) at 1,000 endpoints (tracemalloc). Printed: ms per tick (median of rounds), the share of
one core at one tick per 5 s, the ratio to the baseline, and the bytes held.

    .venv/bin/python benchmarks/bench_dashboard_history.py [--rounds 7] [--ticks 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from typing import Any

import orjson

from corral.contracts.traffic import LatencyHistogram
from corral.router.dashboard.history import STEP_SECONDS, FleetHistory


def fleet(endpoints: int, served: int) -> dict[str, Any]:
    body = []
    for i in range(endpoints):
        ttfts = [0.05 + 0.001 * (j % 50) for j in range(served + i % 7)]
        latency = LatencyHistogram.of_values(ttfts).to_wire()
        traffic = {"requests": len(ttfts), "errors": i % 3, "ttft": latency, "itl": latency}
        body.append(
            {
                "url": f"http://10.0.{i // 250}.{i % 250}:8000",
                "name": f"engine-{i}",
                "models": [f"m{i % 10}"],
                "traffic": traffic,
                "load": {"running": 3.0, "waiting": float(i % 4), "kv_usage": 0.4},
            }
        )
    counted = {f"m{m}": {"requests": served * endpoints, "errors": 0} for m in range(10)}
    return {"endpoints": body, "model_requests": counted}


def timed(endpoints: int, ticks: int) -> tuple[float, float]:
    views = [fleet(endpoints, 100 + s) for s in range(ticks + 1)]
    history = FleetHistory()
    history.sample(views[0], 0.0, 0.0)
    started = time.perf_counter()
    for i, view in enumerate(views[1:], start=1):
        history.sample(view, i * STEP_SECONDS, i * STEP_SECONDS)
    ours = (time.perf_counter() - started) / ticks
    started = time.perf_counter()
    for view in views[1:]:
        orjson.dumps(view)
    return ours, (time.perf_counter() - started) / ticks


def held_bytes(endpoints: int) -> int:
    views = [fleet(endpoints, 100 + s) for s in range(2)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    history = FleetHistory()
    for i in range(history.points):
        history.sample(views[i % 2], i * STEP_SECONDS, i * STEP_SECONDS)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ticks", type=int, default=20)
    args = parser.parse_args()
    print(f"{'endpoints':>9} {'tick ms':>8} {'core %':>7} {'dumps ms':>9} {'ratio':>6}")
    for endpoints in (10, 100, 1000):
        rounds = [timed(endpoints, args.ticks) for _ in range(args.rounds)]
        ours = statistics.median(r[0] for r in rounds)
        base = statistics.median(r[1] for r in rounds)
        share = 100 * ours / STEP_SECONDS
        print(f"{endpoints:>9} {ours * 1e3:>8.2f} {share:>7.3f} {base * 1e3:>9.2f} {ours / base:>6.2f}")
    print(f"held after a full span at 1,000 endpoints: {held_bytes(1000) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
