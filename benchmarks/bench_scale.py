"""A thousand endpoints: what the router's routing costs as the fleet grows (issue 17, item 4).

Sections (all on loopback, bounded in time and count; `--sections` picks some):

  decision  the routing decision per request, per policy, at 2, 10, 100, 1,000 endpoints: a
            microbenchmark of what the data path does per request (`Membership.eligible` then the
            router's policy `pick`, the slow-start cap included) on real `Endpoint`s of a real
            `Membership`, with 32 requests kept in flight; prompts from 24 prefix groups, sessions.
  churn     1,000 endpoints with 10 membership events a second (Membership driven directly, as the
            consumer of any source drives it: a state flip, a model-list update, a removal and re-add),
            each followed by requests: the CPU the events and the rebuilds they cause add.
  live      one process serving N fake engines (each answers a real vLLM `/metrics` page, `/v1/models`
            and chat completions with a real vLLM body), each `corral router` alone on CPU 0 (taskset),
            the load generator (wrk, 32 connections; benchmarks/loadgen.py when wrk is missing) and the
            engines on the other CPUs: per policy and fleet size, the router's idle CPU and the scrapes
            it sends, then req/s, p99 and the router's CPU per request after a warm-up. On a shared
            machine one run's req/s says little, so every target is measured `--repeats` times, in
            turn, each time between two measurements of round robin at the fewest endpoints (one
            router kept up all run): the summary gives each target's median and spread of req/s over
            that baseline ("x req/s") and of CPU per request over the baseline's ("x CPU/req").

    .venv/bin/python benchmarks/bench_scale.py [--sections decision,churn,live] [--seconds 8]
        [--sizes 10,1000] [--baseline-size 10] [--policies ...] [--repeats 3] [--warmup 1]
        [--router-src <checkout>/src]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corral.engine_state import EngineState
from corral.policy_names import POLICY_NAMES
from corral.router.membership.endpoint import Endpoint
from corral.router.membership.membership import Membership
from corral.router.routing.config import RoutingConfig
from corral.router.routing.request import RouteRequest
from corral.router.routing.selector import Routing

MODEL = "bench-model"
SIZES = (2, 10, 100, 1000)
IN_FLIGHT = 32
GROUPS = 24
SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm-samples"


def fleet(n: int) -> Membership:
    membership = Membership()
    for i in range(n):
        url = f"http://10.{i // 65536}.{i // 256 % 256}.{i % 256}:8000"
        membership.add(Endpoint(url, frozenset({MODEL}), EngineState.READY, "bench"), "bench")
    return membership


def requests(count: int, seed: int = 0) -> list[RouteRequest]:
    """Chat requests from `GROUPS` prefix groups (a 600-character system prompt each), sessions."""
    rng = random.Random(seed)
    systems = [f"You are assistant {g}. " + "Follow the house rules carefully. " * 18 for g in range(GROUPS)]
    out = []
    for i in range(count):
        group = rng.randrange(GROUPS)
        payload = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": systems[group]},
                {"role": "user", "content": f"question {i}"},
            ],
        }
        out.append(RouteRequest(MODEL, {"x-session-id": f"user-{rng.randrange(500)}"}, payload))
    return out


def decision_us(policy: str, seconds: float) -> list[float]:
    """Microseconds per decision at each of `SIZES`, requests kept `IN_FLIGHT` deep: the best of rounds
    that alternate between the sizes (so a busy machine slows every size alike)."""
    routes = requests(2048)
    fleets = []
    for n in SIZES:
        membership = fleet(n)
        routing = Routing(policy, RoutingConfig(), "x-session-id", membership.endpoints, seed=1)
        fleets.append((membership, routing.policy.pick))
    best = [float("inf")] * len(SIZES)
    deadline = time.perf_counter() + seconds
    rounds = 0
    while time.perf_counter() < deadline or rounds < 3:
        rounds += 1
        for k, (membership, pick) in enumerate(fleets):
            open_: deque[Endpoint] = deque()
            start = time.perf_counter()
            for route in routes:
                endpoint = pick(membership.eligible(MODEL), route)
                endpoint.in_flight += 1
                open_.append(endpoint)
                if len(open_) > IN_FLIGHT:
                    open_.popleft().in_flight -= 1
            best[k] = min(best[k], (time.perf_counter() - start) / len(routes) * 1e6)
            for endpoint in open_:
                endpoint.in_flight -= 1
    return best


def section_decision(seconds: float) -> None:
    print(f"decision time per request (us; eligible + pick, {IN_FLIGHT} in flight, best of rounds)")
    print(f"  {'policy':14}" + "".join(f"{n:>10}" for n in SIZES) + "   1000/2")
    for policy in POLICY_NAMES:
        times = decision_us(policy, seconds)
        cells = "".join(f"{t:10.2f}" for t in times)
        print(f"  {policy:14}{cells}   {times[-1] / times[0]:5.2f}x", flush=True)


def section_churn(seconds: float, n: int = 1000, rate: float = 10.0, rps: float = 1000.0) -> None:
    """CPU seconds per second spent on `rate` events/s (and the rebuilds the next request pays) at a
    steady `rps` of decisions, against the same decisions without events."""
    print(f"membership churn: {n} endpoints, {rate:g} events/s, {rps:g} decisions/s (prefix policy)")
    for events in (False, True):
        membership = fleet(n)
        routing = Routing("prefix", RoutingConfig(), "x-session-id", membership.endpoints, seed=1)
        pick = routing.policy.pick
        batch = requests(int(rps))
        urls = [e.url for e in membership.endpoints()]
        rng = random.Random(2)
        per_event = int(rps / rate)
        cpu0 = time.process_time()
        wall = 0.0
        steps = 0
        while wall < seconds:
            for i, route in enumerate(batch):
                if events and i % per_event == 0:
                    churn(membership, urls, rng, steps)
                    steps += 1
                endpoint = pick(membership.eligible(MODEL), route)
                endpoint.in_flight += 1
                endpoint.in_flight -= 1
            wall += 1.0  # one simulated second: `rps` decisions and `rate` events
        cpu = (time.process_time() - cpu0) / wall
        label = "with events" if events else "no events  "
        print(f"  {label}  {cpu * 100:6.2f}% of a core  (eligible sets built: {membership.eligible_builds})")


def churn(membership: Membership, urls: list[str], rng: random.Random, step: int) -> None:
    """One event of the kinds a pod watch delivers: not ready, ready again, models refreshed, replaced."""
    url = urls[rng.randrange(len(urls))]
    kind = step % 4
    if kind == 0:
        membership.update(url, "readiness probe failed", state=EngineState.STARTING)
    elif kind == 1:
        membership.update(url, "ready", state=EngineState.READY)
        for u in urls:  # bring back any left not ready by kind 0
            e = membership.get(u)
            if e is not None and e.state is not EngineState.READY:
                membership.update(u, "ready", state=EngineState.READY)
                break
    elif kind == 2:
        membership.update(url, "pod updated", models=frozenset({MODEL}))
    else:
        membership.remove(url, "pod replaced")
        membership.add(Endpoint(url, frozenset({MODEL}), EngineState.READY, "bench"), "bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--sections", default="decision,churn,live")
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement (decision: per cell / 8)")
    parser.add_argument(
        "--sizes", default="10,1000", help="live section: endpoints (the fewest: the baseline)"
    )
    parser.add_argument("--baseline-size", type=int, help="live section: the baseline's endpoints instead")
    parser.add_argument("--policies", default=",".join(POLICY_NAMES), help="live section")
    parser.add_argument(
        "--models-refresh", type=float, help="live section: the router's default if not given"
    )
    parser.add_argument("--repeats", type=int, default=3, help="live section: measurements per target")
    parser.add_argument("--warmup", type=float, default=1.0, help="live section: seconds of load not counted")
    parser.add_argument(
        "--idle-seconds", type=float, help="live section: idle CPU window (default: --seconds)"
    )
    parser.add_argument(
        "--router-src", help="live section: run the routers from this checkout's src/ (a change's parent)"
    )
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    if "decision" in sections:
        section_decision(max(0.3, args.seconds / 8))
    if "churn" in sections:
        section_churn(max(2.0, args.seconds / 2))
    if "live" in sections:
        from scale_fleet import section_live

        sizes = [int(s) for s in args.sizes.split(",")]
        section_live(
            sizes,
            args.policies.split(","),
            args.seconds,
            args.models_refresh,
            repeats=args.repeats,
            warmup=args.warmup,
            idle_seconds=args.idle_seconds,
            router_src=args.router_src,
            base_size=args.baseline_size,
        )


if __name__ == "__main__":
    main()
