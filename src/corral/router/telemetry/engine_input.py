"""What the router refused of what engines and supervisors sent it (KV events, `/metrics` pages, state
lines), and the picks where the KV index failed and the prefix memory answered: counters by source and
reason, rendered on the router's `/metrics`. Each refusal costs the sender its feed, scrape or stream;
these counters are how an operator sees it happen."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

KV_EVENTS = "kv_events"
METRICS_PAGE = "metrics_page"
STATE_LINE = "state_line"


class EngineInputRefusals:
    """Counts of refused input by (source, reason), and of KV-index picks that fell back."""

    def __init__(self) -> None:
        self.refused: dict[tuple[str, str], int] = {}
        self.kv_fallbacks = 0

    def count(self, source: str, reason: str) -> None:
        key = (source, reason)
        self.refused[key] = self.refused.get(key, 0) + 1

    def families(self) -> Iterator[Metric]:
        refused = CounterMetricFamily(
            "corral_router_engine_input_refused",
            "Input from engines and supervisors the router refused, by source (kv_events: the engine's "
            "feed paused and its index entries dropped; metrics_page: that scrape; state_line: the stream "
            "closed and reconnected) and reason.",
            labels=["source", "reason"],
        )
        for (source, reason), n in sorted(self.refused.items()):
            refused.add_metric([source, reason], n)
        yield refused
        yield CounterMetricFamily(
            "corral_router_kv_index_fallbacks",
            "Prefix picks where reading the KV-event index failed and the prefix memory answered instead.",
            value=self.kv_fallbacks,
        )
