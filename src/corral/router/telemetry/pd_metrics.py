"""The router's prefill/decode figures: per-leg latency, the transfer time between the legs, the pairs
chosen and the failures by leg, bumped by the P/D data path (router/datapath/pd.py) and rendered as
metric families when scraped."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily, Metric

from corral.metric_families import labelled_counter
from corral.router.telemetry.histogram import Histogram

LEG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class PdMetrics:
    """Counters and histograms of the two-leg path; one per router (`RouterMetrics.pd`)."""

    __slots__ = ("decode_ttft", "failures", "handoffs", "pairs", "prefill_leg", "transfer")

    def __init__(self) -> None:
        # From the prefill leg's dispatch to its whole answer.
        self.prefill_leg = Histogram(LEG_BUCKETS)
        # From the decode leg's dispatch to its first byte (the KV pull and the first token).
        self.decode_ttft = Histogram(LEG_BUCKETS)
        # From the prefill answer to the decode leg's first byte: the router's view of the transfer.
        self.transfer = Histogram(LEG_BUCKETS)
        self.pairs: dict[tuple[str, str], int] = {}
        self.failures: dict[tuple[str, str], int] = {}
        self.handoffs: dict[tuple[str, ...], int] = {}

    def count_pair(self, prefill: str, decode: str) -> None:
        key = (prefill, decode)
        self.pairs[key] = self.pairs.get(key, 0) + 1

    def count_failure(self, leg: str, why: str) -> None:
        key = (leg, why)
        self.failures[key] = self.failures.get(key, 0) + 1

    def count_handoff(self, mode: str) -> None:
        key = (mode,)
        self.handoffs[key] = self.handoffs.get(key, 0) + 1

    def families(self) -> Iterator[Metric]:
        yield labelled_counter(
            "corral_router_pd_handoffs",
            "Prefill legs answered, by how the KV reached the decode leg: params (the answer's "
            "kv_transfer_params, carried by the decode leg; pending until it answers) or storage (no params: "
            "the decode engine finds the prompt's KV in a store shared with the prefill engine).",
            ["mode"],
            self.handoffs,
        )
        yield labelled_counter(
            "corral_router_pd_pairs",
            "Decode legs sent, by the prefill endpoint whose transfer they carried and the decode endpoint.",
            ["prefill", "decode"],
            {key: n for key, n in self.pairs.items()},
        )
        yield labelled_counter(
            "corral_router_pd_failures",
            "P/D legs that failed, by leg (prefill, decode) and why: upstream (no answer), engine_error "
            "(5xx), no_transfer_params (a prefill answer without kv_transfer_params from a connector that "
            "needs them), no_pair (no "
            "compatible prefill/decode pair was routable).",
            ["leg", "why"],
            {key: n for key, n in self.failures.items()},
        )
        for name, doc, histogram in (
            (
                "corral_router_pd_prefill_leg_seconds",
                "Time from the prefill leg's dispatch to the prefill engine's whole answer.",
                self.prefill_leg,
            ),
            (
                "corral_router_pd_decode_ttft_seconds",
                "Time from the decode leg's dispatch to its first byte (the KV pull and the first token).",
                self.decode_ttft,
            ),
            (
                "corral_router_pd_transfer_seconds",
                "Time from the prefill engine's answer to the decode leg's first byte.",
                self.transfer,
            ),
        ):
            yield HistogramMetricFamily(name, doc, buckets=histogram.cumulative(), sum_value=histogram.total)
