"""The price of slow start on the pick, in process: µs per pick of a policy alone, behind `SlowStart`
off (0 s), on with nobody ramping, and on while one endpoint of n ramps (the cap's bookkeeping).

    .venv/bin/python benchmarks/bench_slow_start.py [--picks 20000] [--policy round_robin]
"""

from __future__ import annotations

import argparse
import time

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.request import RouteRequest
from corral.router.routing.selector import build_policy
from corral.router.routing.slow_start import SlowStart


def per_pick(pick: object, endpoints: list[Endpoint], picks: int) -> float:
    request = RouteRequest("m", {})
    fn = pick  # a bound pick method
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(picks):
            fn(endpoints, request)  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return best / picks * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--picks", type=int, default=20000)
    parser.add_argument("--policy", default="round_robin")
    args = parser.parse_args()
    print("| n | policy alone | slow start off | on, nobody ramping | on, one ramping |")
    print("|---|---|---|---|---|")
    for n in (2, 8, 32):
        endpoints = [Endpoint(f"http://10.0.0.{i}:80", frozenset({"m"}), EngineState.READY) for i in range(n)]
        now = time.monotonic()
        for e in endpoints:
            e.routable_from = now - 3600
        policy = build_policy(args.policy, seed=1)
        alone = per_pick(policy.pick, endpoints, args.picks)
        off = per_pick(SlowStart(policy, 0.0).pick, endpoints, args.picks)
        quiet = per_pick(SlowStart(policy, 60.0).pick, endpoints, args.picks)
        endpoints[-1].routable_from = time.monotonic()
        ramping = per_pick(SlowStart(policy, 600.0).pick, endpoints, args.picks)
        print(f"| {n} | {alone:.2f} µs | {off:.2f} µs | {quiet:.2f} µs | {ramping:.2f} µs |")


if __name__ == "__main__":
    main()
