"""What the dashboard's one-minute model window costs its feed per read, at 10, 100 and 1,000 endpoints.

The feed reads the fleet view at most every 0.5 s while a dashboard is open and takes the window on it
(`corral.router.dashboard.windows.ModelWindows.update`). Two cases per size: every endpoint's traffic
changed since the baseline (the busy worst case), and none did (an idle fleet). The baseline, timed in
the same process and interleaved in rounds, is the obvious implementation: each changed endpoint's
`TrafficFigures` validated and subtracted (`TrafficFigures.minus`). Printed: milliseconds per read
(median of rounds), the share of one core at one read per 0.5 s, and the ratio to the baseline.

    .venv/bin/python benchmarks/bench_dashboard_windows.py [--rounds 7] [--reads 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from corral.contracts.traffic import LatencyHistogram, TrafficFigures
from corral.router.dashboard.windows import ModelWindows

INTERVAL = 0.5  # the feed's read interval


def fleet(endpoints: int, served: int) -> dict[str, Any]:
    body = []
    for i in range(endpoints):
        ttfts = [0.05 + 0.001 * (j % 50) for j in range(served + i % 7)]
        traffic = {
            "requests": len(ttfts),
            "errors": i % 3,
            "ttft": LatencyHistogram.of_values(ttfts).to_wire(),
            "itl": {},
        }
        body.append({"url": f"http://e{i}", "models": [f"m{i % 10}"], "traffic": traffic})
    return {"endpoints": body}


def baseline_window(earlier: dict[str, Any], later: dict[str, Any]) -> int:
    """Each changed endpoint's figures as models, subtracted; summed per model (requests only: the
    model validation is the cost)."""
    before = {e["url"]: e["traffic"] for e in earlier["endpoints"]}
    per_model: dict[str, int] = {}
    for e in later["endpoints"]:
        old = before.get(e["url"])
        if old == e["traffic"]:
            continue
        window = TrafficFigures.model_validate(e["traffic"])
        if old is not None:
            window = window.minus(TrafficFigures.model_validate(old))
        for model in e["models"]:
            per_model[model] = per_model.get(model, 0) + window.requests
    return sum(per_model.values())


def timed(windows: ModelWindows, sequence: list[dict[str, Any]]) -> tuple[float, float]:
    """Seconds per read: ours on `sequence` (after a baseline reading), then the baseline's."""
    baseline = sequence[0]
    windows.update(baseline, 0.0)
    started = time.perf_counter()
    for i, view in enumerate(sequence[1:], start=1):
        windows.update(view, i * INTERVAL)
    ours = (time.perf_counter() - started) / (len(sequence) - 1)
    started = time.perf_counter()
    for view in sequence[1:]:
        baseline_window(baseline, view)
    return ours, (time.perf_counter() - started) / (len(sequence) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reads", type=int, default=20)
    args = parser.parse_args()
    print(f"{'endpoints':>9} {'case':<6} {'window ms':>10} {'core %':>7} {'baseline ms':>12} {'ratio':>6}")
    for endpoints in (10, 100, 1000):
        views = [fleet(endpoints, 100 + s) for s in range(3)]
        busy = [views[0], *(views[1 + i % 2] for i in range(args.reads))]
        idle = [views[0]] * (args.reads + 1)
        for case, sequence in (("busy", busy), ("idle", idle)):
            rounds = [timed(ModelWindows(), sequence) for _ in range(args.rounds)]
            mine = statistics.median(r[0] for r in rounds)
            base = statistics.median(r[1] for r in rounds)
            print(
                f"{endpoints:>9} {case:<6} {mine * 1000:>10.2f} {100 * mine / INTERVAL:>6.1f}% "
                f"{base * 1000:>12.2f} {mine / base:>5.2f}x"
            )


if __name__ == "__main__":
    main()
