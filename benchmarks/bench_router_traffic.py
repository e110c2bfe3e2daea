"""The price of the router's per-endpoint traffic figures, in process: what they add per relayed
stream chunk (`StreamTimes` after `StreamEnding`), and at n endpoints the cost of `/v1/fleet`'s
`traffic` bodies and of the `/metrics` series, written by `endpoint_series` and, for comparison, by
prometheus_client's writer (what a collector would have cost), against the rest of the router's page.

    .venv/bin/python benchmarks/bench_router_traffic.py [--endpoints 1000]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Iterator

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from corral.engine.stream_ending import StreamEnding
from corral.router.membership.endpoint import Endpoint
from corral.router.telemetry.endpoint_series import endpoint_series
from corral.router.telemetry.metrics import TTFT_BUCKETS, RouterCollector, RouterMetrics
from corral.router.telemetry.traffic import StreamTimes

CHUNK = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
    b'"text":" you","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
)


def best_ms(fn: Callable[[], object], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def per_chunk_ns(endpoint: Endpoint, timed: bool, chunks: int = 200_000) -> float:
    ending = StreamEnding()
    ending.feed(CHUNK)
    times = StreamTimes(endpoint.traffic, time.monotonic(), 0.0)
    times.feed(CHUNK, True)

    def run() -> None:
        for _ in range(chunks):
            ending.feed(CHUNK)
            if timed:
                times.feed(CHUNK, ending.tokens_emitted)

    return best_ms(run, 3) * 1e6 / chunks


class ViaClient:
    """The same three families through prometheus_client (a collector), for comparison."""

    def __init__(self, endpoints: list[Endpoint]) -> None:
        self.endpoints = endpoints

    def collect(self) -> Iterator[Metric]:
        answered = CounterMetricFamily("corral_router_endpoint_requests", "", labels=["endpoint", "outcome"])
        ttft = HistogramMetricFamily("corral_router_endpoint_ttft_seconds", "", labels=["endpoint"])
        warmup = GaugeMetricFamily("corral_router_endpoint_warmup_ttft_seconds", "", labels=["endpoint"])
        for e in self.endpoints:
            t = e.traffic
            answered.add_metric([e.url, "ok"], t.requests - t.errors)
            answered.add_metric([e.url, "error"], t.errors)
            ttft.add_metric([e.url], t.ttft.folded(TTFT_BUCKETS), t.ttft.total)
            if t.warmup_ttft_s is not None:
                warmup.add_metric([e.url], t.warmup_ttft_s)
        yield answered
        yield ttft
        yield warmup


def registry_of(collector: object) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    return registry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--endpoints", type=int, default=1000)
    args = parser.parse_args()
    rng = random.Random(0)
    endpoints = [
        Endpoint(f"http://10.0.{i // 250}.{i % 250}:8000", frozenset({"m"})) for i in range(args.endpoints)
    ]
    for e in endpoints:
        for _ in range(200):
            e.traffic.ended(rng.random() < 0.02)
            e.traffic.first_token(rng.lognormvariate(-3, 1), 1.0, 0.0)
            e.traffic.gap(rng.lognormvariate(-4, 0.5))
    alone, timed = per_chunk_ns(endpoints[0], False), per_chunk_ns(endpoints[0], True)
    print(f"per relayed chunk: StreamEnding {alone:.0f} ns, with StreamTimes {timed:.0f} ns")
    fleet = best_ms(lambda: orjson.dumps([e.traffic.to_json() for e in endpoints]))
    print(f"/v1/fleet traffic bodies, {args.endpoints} endpoints: {fleet:.1f} ms")
    rest = registry_of(RouterCollector(RouterMetrics(), lambda: endpoints))
    via = registry_of(ViaClient(endpoints))
    print(f"/metrics, the rest of the router's page: {best_ms(lambda: generate_latest(rest)):.1f} ms")
    size = len(endpoint_series(endpoints)) // 1000
    written = best_ms(lambda: endpoint_series(endpoints))
    print(f"/metrics traffic series, endpoint_series: {written:.1f} ms ({size} kB)")
    print(f"/metrics traffic series, prometheus_client: {best_ms(lambda: generate_latest(via)):.1f} ms")


if __name__ == "__main__":
    main()
