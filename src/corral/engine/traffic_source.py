"""The engine's own traffic figures: `TrafficFigures` read from vLLM's `/metrics` (requests ended and
errors from `vllm:request_success_total{finished_reason}`, TTFT and ITL from the engine's histograms on
its own bucket bounds), summed over data-parallel engines and served models; and the TTFT of a first
request (a warmup), isolated as the difference of two readings around it.

vLLM counts a request that ended in an engine error under `finished_reason="error"`; a 4xx it refused
at the API never reaches the engine and is no error of the engine's.
"""

from __future__ import annotations

import aiohttp

from corral.contracts.traffic import LatencyHistogram, TrafficFigures
from corral.engine.load_sample import MetricsUnavailable, fetch_metrics_text
from corral.engine.metric_names import FINISHED, INTER_TOKEN_LATENCY, TIME_TO_FIRST_TOKEN
from corral.engine.metrics_text import samples

ENGINE_METRICS = "engine_metrics"  # the `source` of a window read from these figures
ERROR_REASON = "error"
# vLLM before `inter_token_latency_seconds` (0.10) timed the same gaps under this name; read only where
# the new family is absent (the releases that show both show the same figures twice)
INTER_TOKEN_LATENCY_BEFORE_RENAME = "vllm:time_per_output_token_seconds"
_HISTOGRAMS = (TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY, INTER_TOKEN_LATENCY_BEFORE_RENAME)
_NAMES = (FINISHED, *(h + suffix for h in _HISTOGRAMS for suffix in ("_bucket", "_sum")))


class _Family:
    """One histogram family's `_bucket` and `_sum` samples, added up over label sets that share bounds."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cumulative: dict[float, float] = {}
        self.total = 0.0
        self.bounds_of: dict[tuple[tuple[str, str], ...], set[float]] = {}

    def bucket(self, labels: dict[str, str], value: float) -> None:
        le = float(labels["le"])  # "+Inf" reads as inf
        series = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        self.bounds_of.setdefault(series, set()).add(le)
        self.cumulative[le] = self.cumulative.get(le, 0.0) + value

    def histogram(self) -> LatencyHistogram:
        if not self.cumulative:
            return LatencyHistogram(bounds=[])
        shapes = {frozenset(b) for b in self.bounds_of.values()}
        if len(shapes) > 1:
            raise ValueError(f"{self.name}: its series have different bucket bounds; they cannot be added up")
        les = sorted(self.cumulative)
        if les[-1] != float("inf"):
            raise ValueError(f'{self.name}: no le="+Inf" bucket')
        return LatencyHistogram.from_cumulative(
            les[:-1], [self.cumulative[le] for le in les], round(self.total, 9)
        )


def traffic_figures(text: str) -> TrafficFigures:
    """The engine's cumulative figures since it started; raises ValueError on text that is not
    Prometheus exposition or histograms that cannot be added up."""
    requests = errors = 0.0
    families = {name: _Family(name) for name in _HISTOGRAMS}
    for sample in samples(text, _NAMES, strict=True):
        if sample.name == FINISHED:
            requests += sample.value
            if sample.labels.get("finished_reason") == ERROR_REASON:
                errors += sample.value
            continue
        family = families[sample.name.rsplit("_", 1)[0]]
        if sample.name.endswith("_bucket"):
            family.bucket(sample.labels, sample.value)
        else:
            family.total += sample.value
    return TrafficFigures(
        requests=round(requests),
        errors=round(errors),
        ttft=families[TIME_TO_FIRST_TOKEN].histogram(),
        itl=(
            families[INTER_TOKEN_LATENCY]
            if families[INTER_TOKEN_LATENCY].cumulative
            else families[INTER_TOKEN_LATENCY_BEFORE_RENAME]
        ).histogram(),
    )


async def fetch_traffic(
    session: aiohttp.ClientSession, engine_url: str, within: float = 5.0
) -> TrafficFigures:
    """Read the engine's figures now; raises MetricsUnavailable (no answer, or not Prometheus text)."""
    text = await fetch_metrics_text(session, engine_url, within)
    try:
        return traffic_figures(text)
    except ValueError as exc:
        raise MetricsUnavailable(f"/metrics: {exc}") from exc


def first_request_ttft_s(before: TrafficFigures, after: TrafficFigures) -> float | None:
    """The TTFT the engine measured for the one request between two readings (its `_sum` grew by
    exactly that); None when not exactly one request got a first token in between, so it cannot be
    told apart."""
    if after.ttft.bucket_bounds() != before.ttft.bucket_bounds() and before.ttft.count:
        return None
    if after.ttft.count - before.ttft.count != 1:
        return None
    return max(0.0, after.ttft.sum - before.ttft.sum)
