"""Prometheus metric families built at scrape time from plain counters (the router's and the admission
gate's custom collectors), so that nothing Prometheus-side runs per request."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


def labelled_counter(
    name: str, doc: str, labels: list[str], values: Mapping[tuple[str, ...], float]
) -> CounterMetricFamily:
    """One counter family with a sample per label tuple, in a stable (sorted) order."""
    family = CounterMetricFamily(name, doc, labels=labels)
    for label_values, n in sorted(values.items()):
        family.add_metric(list(label_values), n)
    return family


def labelled_gauge(
    name: str, doc: str, labels: list[str], values: Mapping[tuple[str, ...], float]
) -> GaugeMetricFamily:
    """One gauge family with a sample per label tuple, in a stable (sorted) order."""
    family = GaugeMetricFamily(name, doc, labels=labels)
    for label_values, n in sorted(values.items()):
        family.add_metric(list(label_values), n)
    return family
