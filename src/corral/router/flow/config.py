"""Flow control's settings (`corral router --flow-*`): when an engine counts as saturated, how long a
request may wait in each band, how many may wait, and how a flow orders its own requests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.router.flow.queue import Order

# Priorities and their header are bounded: a band per value, so the range keeps the bands few.
MIN_PRIORITY = -1000
MAX_PRIORITY = 1000
MAX_WEIGHT = 1000
MAX_DEADLINE_MS = 86_400_000  # a day
PRIORITY_HEADER = "x-corral-priority"
DEADLINE_HEADER = "x-corral-deadline-ms"
FAIRNESS_HEADER = "x-corral-fairness-id"  # an open router's flows (a tenant is always its own flow)


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowConfig:
    """`engine_max_in_flight`: requests this host's router(s) keep open on one engine before it counts as
    saturated (0: no such bound); `max_waiting`, `max_kv_usage`: the engine's own figures (from its
    /metrics) at or over which it counts as saturated until one of the requests it had then ends or
    fresher figures come."""

    engine_max_in_flight: int = 0
    max_waiting: int = 1
    max_kv_usage: float = 0.95
    ttl_seconds: float = 30.0
    band_ttl_seconds: Mapping[int, float] = field(default_factory=dict)
    max_queue: int = 10_000
    max_queue_per_flow: int = 1_000
    order: Order = "fcfs"
    retry_after_seconds: int = 2
    slot_shares: bool = True  # corral.router.flow.shares; needs engine_max_in_flight
    share_window_seconds: float = 2.0
    tick_seconds: float = 0.05  # how often a non-empty queue looks at fresher figures and expiries

    def ttl(self, priority: int) -> float:
        return self.band_ttl_seconds.get(priority, self.ttl_seconds)
