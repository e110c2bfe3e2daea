"""What flow control counts: requests waiting by band and tenant, how long those let out waited, and
every way a request left the queue other than to an engine (shed, expired, displaced, its client gone).
Read as Prometheus families on /metrics and as the `flow` section of /v1/fleet. Labelled by tenant name
only, never a key; on an open router the tenant label is empty (fairness ids are the client's)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from corral.metric_families import labelled_counter, labelled_gauge
from corral.router.telemetry.histogram import Histogram

WAIT_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Why a request left the queue (or never entered it) without reaching an engine.
SHED_REASONS = ("saturated", "queue_full", "flow_full", "displaced", "ttl")

Key = tuple[int, str]  # (band, tenant label)


class FlowStats:
    __slots__ = ("depth", "dispatched", "gone", "passed", "queued", "shed", "waits")

    def __init__(self) -> None:
        self.depth: dict[Key, int] = {}
        self.waits: dict[Key, Histogram] = {}
        self.shed: dict[tuple[int, str, str], int] = {}  # (band, tenant, reason)
        self.queued: dict[Key, int] = {}
        self.dispatched: dict[Key, int] = {}
        self.gone: dict[Key, int] = {}  # clients that hung up while queued
        self.passed = 0  # requests that found room and went on at once

    def entered(self, key: Key) -> None:
        self.depth[key] = self.depth.get(key, 0) + 1
        self.queued[key] = self.queued.get(key, 0) + 1

    def left(self, key: Key) -> None:
        left = self.depth[key] - 1
        if left:
            self.depth[key] = left
        else:
            del self.depth[key]

    def let_out(self, key: Key, waited: float) -> None:
        self.dispatched[key] = self.dispatched.get(key, 0) + 1
        waits = self.waits.get(key)
        if waits is None:
            waits = self.waits[key] = Histogram(WAIT_BOUNDS)
        waits.observe(waited)

    def count_shed(self, key: Key, reason: str) -> None:
        shed_key = (key[0], key[1], reason)
        self.shed[shed_key] = self.shed.get(shed_key, 0) + 1

    def count_gone(self, key: Key) -> None:
        self.gone[key] = self.gone.get(key, 0) + 1

    def to_json(self, oldest_age: float | None) -> dict[str, Any]:
        by_band: dict[str, int] = {}
        by_tenant: dict[str, int] = {}
        for (band, tenant), n in self.depth.items():
            by_band[str(band)] = by_band.get(str(band), 0) + n
            by_tenant[tenant] = by_tenant.get(tenant, 0) + n
        shed: dict[str, int] = {}
        for (_, _, reason), n in self.shed.items():
            shed[reason] = shed.get(reason, 0) + n
        return {
            "depth": sum(self.depth.values()),
            "depth_by_band": by_band,
            "depth_by_tenant": by_tenant,
            "oldest_age_seconds": round(oldest_age, 3) if oldest_age is not None else None,
            "shed": shed,
            "dispatched": sum(self.dispatched.values()),
            "client_gone": sum(self.gone.values()),
            "passed": self.passed,
        }


def _labels(key: Key) -> tuple[str, str]:
    return str(key[0]), key[1]


class FlowCollector:
    def __init__(self, stats: FlowStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        yield labelled_gauge(
            "corral_router_flow_queue_depth",
            "Requests waiting in the router's flow queue (every eligible engine saturated), by priority "
            "band and tenant.",
            ["band", "tenant"],
            {_labels(k): n for k, n in stats.depth.items()},
        )
        yield labelled_counter(
            "corral_router_flow_queued",
            "Requests that entered the flow queue, by band and tenant.",
            ["band", "tenant"],
            {_labels(k): n for k, n in stats.queued.items()},
        )
        yield labelled_counter(
            "corral_router_flow_dispatched",
            "Requests let out of the flow queue to an engine, by band and tenant.",
            ["band", "tenant"],
            {_labels(k): n for k, n in stats.dispatched.items()},
        )
        yield labelled_counter(
            "corral_router_flow_shed",
            "Requests answered 429 by flow control, by band, tenant and reason: saturated (a sheddable "
            "request, negative priority, while saturated), queue_full, flow_full (the tenant's bound), "
            "displaced (by a higher band when the queue was full), ttl (waited its band's TTL).",
            ["band", "tenant", "reason"],
            {(str(b), t, r): n for (b, t, r), n in stats.shed.items()},
        )
        yield labelled_counter(
            "corral_router_flow_client_gone",
            "Requests whose client hung up while they waited in the flow queue, by band and tenant.",
            ["band", "tenant"],
            {_labels(k): n for k, n in stats.gone.items()},
        )
        waits = HistogramMetricFamily(
            "corral_router_flow_wait_seconds",
            "Time requests let out to an engine waited in the flow queue, by band and tenant.",
            labels=["band", "tenant"],
        )
        for key, hist in sorted(stats.waits.items()):
            waits.add_metric(list(_labels(key)), hist.cumulative(), hist.total)
        yield waits
        yield CounterMetricFamily(
            "corral_router_flow_passed",
            "Requests that found an engine with room and went on without waiting (flow control on).",
            value=stats.passed,
        )
