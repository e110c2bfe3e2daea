"""Traffic windows: what a stretch of real traffic left behind (requests, errors, time to first token,
inter-token latency) and the one comparison every observer of a change makes with it.

Three observers read windows, from two kinds of source:

- the rollout canary compares a new serving group with the old ones over the same seconds, from the
  router's per-endpoint figures (`FleetEndpoint.traffic` in `GET /v1/fleet`);
- a runbook operation's OBSERVE compares the window after the change with the PRECHECK baseline, from
  the engine's own histograms (`vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`,
  `vllm:request_success_total{finished_reason="error"}`) or the admission gate's counts;
- `corral verify --observe-seconds` compares the fleet's window with the last change record's.

Figures are cumulative counters (`TrafficFigures`); a window is the difference of two readings
(`later.minus(earlier)`), so no observer needs the source to keep samples, and a reader that misses a
reading loses resolution, never correctness. Latencies are histograms with fine, fixed bounds
(`LATENCY_BOUNDS`: ten per decade, consecutive bounds at most 1.34× apart), so a p99 read from them is
within about a third of a bucket of the true one; `LatencyHistogram.quantile` interpolates inside the
bucket the way Prometheus' `histogram_quantile` does.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import Field

from corral.contracts.window_defaults import (
    GPU_MEMORY_SLACK_GIB,
    ITL_SLACK_MS,
    KV_USAGE_RISE,
    MAX_ERROR_RATIO,
    MAX_GPU_MEMORY_RATIO,
    MAX_ITL_RATIO,
    MAX_QUEUE_RATIO,
    MAX_TTFT_RATIO,
    MIN_REQUESTS,
    QUEUE_SLACK,
    TTFT_SLACK_MS,
)
from corral.contracts.window_figures import FigureCheck, FigureRule, GaugeWindow, check_figure
from corral.contracts.wire import WireModel

# Seconds. Every bound of the router's coarse Prometheus TTFT buckets is one of these, so a
# per-endpoint histogram folds into them exactly.
_STEPS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.5)
LATENCY_BOUNDS: tuple[float, ...] = (
    *(round(step * 10.0**exponent, 6) for exponent in range(-3, 2) for step in _STEPS),
    100.0,
    120.0,
    300.0,
)

Verdict = Literal["passed", "failed", "inconclusive"]
PASSED: Verdict = "passed"
FAILED: Verdict = "failed"
INCONCLUSIVE: Verdict = "inconclusive"  # too few requests in the window to judge: neither passed nor failed


class LatencyHistogram(WireModel):
    """Counts per bucket (not cumulative): `counts[i]` holds values ≤ `bounds[i]` and above the bound
    before it; the last count, one past the bounds, is +Inf. Trailing zero counts may be left out.
    `bounds` None means `LATENCY_BOUNDS` (what the router sends, to keep `/v1/fleet` small)."""

    bounds: list[float] | None = None
    counts: list[int] = Field(default_factory=list)
    sum: float = 0.0

    def bucket_bounds(self) -> tuple[float, ...]:
        return tuple(self.bounds) if self.bounds is not None else LATENCY_BOUNDS

    @property
    def count(self) -> int:
        return sum(self.counts)

    def _full_counts(self) -> list[int]:
        width = len(self.bucket_bounds()) + 1
        return (list(self.counts) + [0] * width)[:width]

    def minus(self, earlier: LatencyHistogram) -> LatencyHistogram:
        """This reading less an earlier one of the same series: the window between them. A counter that
        went backwards (its source restarted) gives this reading whole, never negative counts."""
        if earlier.bucket_bounds() != self.bucket_bounds():
            raise ValueError("the two histograms have different bucket bounds; they are not one series")
        now, before = self._full_counts(), earlier._full_counts()
        if any(n < b for n, b in zip(now, before, strict=True)):
            return self
        return LatencyHistogram(
            bounds=self.bounds,
            counts=trimmed([n - b for n, b in zip(now, before, strict=True)]),
            sum=max(0.0, self.sum - earlier.sum),
        )

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 < q ≤ 1) in seconds, linear inside its bucket; None when empty. A quantile
        that falls in +Inf reads as the highest bound (a lower bound on the truth, as Prometheus does)."""
        counts = self._full_counts()
        total = sum(counts)
        if total == 0:
            return None
        bounds = self.bucket_bounds()
        rank = q * total
        running = 0
        for i, n in enumerate(counts):
            if n and running + n >= rank:
                if i == len(bounds):
                    return bounds[-1]
                lower = bounds[i - 1] if i > 0 else 0.0
                return lower + (bounds[i] - lower) * ((rank - running) / n)
            running += n
        return bounds[-1]

    @classmethod
    def of_values(cls, values: list[float]) -> LatencyHistogram:
        """A histogram of seconds on `LATENCY_BOUNDS` (tests and one-off readers)."""
        counts = [0] * (len(LATENCY_BOUNDS) + 1)
        for value in values:
            counts[bisect.bisect_left(LATENCY_BOUNDS, value)] += 1
        return cls(counts=trimmed(counts), sum=float(sum(values)))

    @classmethod
    def from_cumulative(cls, bounds: list[float], cumulative: list[float], total: float) -> LatencyHistogram:
        """From a Prometheus histogram's `_bucket` samples in `le` order (the +Inf one last) and its
        `_sum`: the engine's own histograms, on their own bounds."""
        if len(cumulative) != len(bounds) + 1:
            raise ValueError(f"{len(cumulative)} cumulative counts for {len(bounds)} bounds (+Inf needed)")
        counts, previous = [], 0.0
        for running in cumulative:
            counts.append(max(0, round(running - previous)))
            previous = max(previous, running)
        return cls(bounds=list(bounds), counts=trimmed(counts), sum=total)


def trimmed(counts: list[int]) -> list[int]:
    """Per-bucket counts without their trailing zeros (how a histogram travels on the wire)."""
    end = len(counts)
    while end and counts[end - 1] == 0:
        end -= 1
    return counts[:end]


class RequestCounts(WireModel):
    """A router's (or gate's) cumulative request counters, all models together: `requests` answered,
    `errors` failed in the router or upstream (5xx, connection failures, streams cut), `stream_failures`
    streams that did not end normally, `abandoned` (a router's only) requests that were out to an engine
    when the router judged it failed (retried elsewhere, or, past their first byte, ended). Read at an
    operation's start and end: the failures during it."""

    requests: int = 0
    errors: int = 0
    stream_failures: int = 0
    abandoned: int = 0

    def minus(self, earlier: RequestCounts) -> RequestCounts:
        return RequestCounts(
            requests=max(0, self.requests - earlier.requests),
            errors=max(0, self.errors - earlier.errors),
            stream_failures=max(0, self.stream_failures - earlier.stream_failures),
            abandoned=max(0, self.abandoned - earlier.abandoned),
        )


class TrafficFigures(WireModel):
    """Cumulative figures for one engine (or a group, summed) since its observer started counting.

    `requests` are answers that ended (any status); `errors` those the serving side failed: a 5xx, a
    stream cut or ended by the engine's error or abort event, a connection that failed after the engine
    was chosen. A client's own 4xx is not an error of the engine. `errors` None: the source cannot see
    them. `warmup_ttft_s` (router only) is the TTFT of the first request since the endpoint last became
    routable — a start, a wake, a return from ejection — kept apart from the steady-state histogram."""

    requests: int = 0
    errors: int | None = 0
    ttft: LatencyHistogram = Field(default_factory=LatencyHistogram)
    itl: LatencyHistogram = Field(default_factory=LatencyHistogram)
    warmup_ttft_s: float | None = None

    def minus(self, earlier: TrafficFigures) -> TrafficFigures:
        """The window between an earlier reading and this one (see `LatencyHistogram.minus`)."""
        if self.requests < earlier.requests:
            return self  # the source restarted: everything it has is inside the window
        errors = None
        if self.errors is not None and earlier.errors is not None:
            errors = max(0, self.errors - earlier.errors)
        return TrafficFigures(
            requests=self.requests - earlier.requests,
            errors=errors,
            ttft=self.ttft.minus(earlier.ttft),
            itl=self.itl.minus(earlier.itl),
            warmup_ttft_s=self.warmup_ttft_s,
        )

    def plus(self, other: TrafficFigures) -> TrafficFigures:
        """Two engines' figures as one group's (histograms on the same bounds)."""
        if other.ttft.bucket_bounds() != self.ttft.bucket_bounds():
            raise ValueError("the two figures' histograms have different bounds")
        errors = None if self.errors is None or other.errors is None else self.errors + other.errors
        return TrafficFigures(
            requests=self.requests + other.requests,
            errors=errors,
            ttft=_added(self.ttft, other.ttft),
            itl=_added(self.itl, other.itl),
            warmup_ttft_s=self.warmup_ttft_s if other.warmup_ttft_s is None else other.warmup_ttft_s,
        )


def windows_between(
    earlier: Mapping[str, TrafficFigures], later: Mapping[str, TrafficFigures]
) -> dict[str, TrafficFigures]:
    """Each source's window between two readings keyed alike (by endpoint URL): a source first seen in
    `later` joined inside the window and counts whole; one gone from `later` counts nothing (its last
    figures went with it). ValueError when a source's two readings are not one series."""
    return {key: now.minus(earlier[key]) if key in earlier else now for key, now in later.items()}


def summed(windows: Iterable[TrafficFigures]) -> TrafficFigures | None:
    """Several sources' windows as one (a serving group's, a fleet's); None when there are none."""
    total: TrafficFigures | None = None
    for window in windows:
        total = window if total is None else total.plus(window)
    return total


def _added(a: LatencyHistogram, b: LatencyHistogram) -> LatencyHistogram:
    if a.bucket_bounds() != b.bucket_bounds():
        raise ValueError("the two histograms have different bucket bounds")
    width = len(a.bucket_bounds()) + 1
    counts = [x + y for x, y in zip(a._full_counts(), b._full_counts(), strict=True)][:width]
    return LatencyHistogram(bounds=a.bounds, counts=trimmed(counts), sum=a.sum + b.sum)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


class WindowSummary(WireModel):
    """One window of traffic, summarised: what a change record keeps and a verdict quotes."""

    source: str  # router | engine_metrics | gate
    seconds: float
    requests: int
    errors: int | None
    error_ratio: float | None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    # gauges over the window, per engine (`contracts.window_figures.GaugeWindow`): the mean
    # `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc` (0-1), the highest GPU memory held;
    # a group's are the mean over its engines
    # None: not measured, `unmeasured` says why (figure -> reason)
    queue_waiting: float | None = None
    kv_usage: float | None = None
    gpu_memory_gib: float | None = None
    gauge_readings: int = 0
    unmeasured: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def of(
        cls, window: TrafficFigures, seconds: float, source: str, gauges: GaugeWindow | None = None
    ) -> WindowSummary:
        """The window's figures; `gauges` None: its source reads no gauges (each figure says so)."""
        unmeasured = {f: f"the {source} source reads no gauges" for f in GAUGE_FIGURES}
        if gauges is not None:
            unmeasured = gauges.why_unmeasured()
        ratio = None
        if window.errors is not None and window.requests:
            ratio = round(window.errors / window.requests, 6)
        return cls(
            source=source,
            seconds=round(seconds, 3),
            requests=window.requests,
            errors=window.errors,
            error_ratio=ratio,
            ttft_p50_ms=_ms(window.ttft.quantile(0.5)),
            ttft_p99_ms=_ms(window.ttft.quantile(0.99)),
            itl_p50_ms=_ms(window.itl.quantile(0.5)),
            itl_p99_ms=_ms(window.itl.quantile(0.99)),
            queue_waiting=gauges.waiting if gauges is not None else None,
            kv_usage=gauges.kv_usage if gauges is not None else None,
            gpu_memory_gib=gauges.gpu_memory_gib if gauges is not None else None,
            gauge_readings=gauges.readings if gauges is not None else 0,
            unmeasured=unmeasured,
        )


GAUGE_FIGURES = ("queue_waiting", "kv_usage", "gpu_memory_gib")


class WindowThresholds(WireModel):
    """How much worse than its baseline a window may be.

    `max_error_ratio`: the window's error ratio may exceed the baseline's by this much (absolute:
    0.02 is two points). `max_ttft_ratio`: its TTFT p99 may be this many times the baseline's —
    unless it is within `ttft_slack_ms` of it, so a 2 ms engine becoming 5 ms does not fail.
    `min_requests`: fewer requests than this in the window cannot be judged (inconclusive).

    The other figures follow one rule (`contracts.window_figures`): the window's value may reach
    `max(baseline × ratio, baseline + slack)`. ITL p99: `max_itl_ratio`, `itl_slack_ms`; the mean
    queue (`vllm:num_requests_waiting` per engine): `max_queue_ratio`, `queue_slack` requests; the
    mean KV utilization (0-1): no ratio, `kv_usage_rise` points above the baseline; GPU memory held
    (per engine, the window's highest reading): `max_gpu_memory_ratio`, `gpu_memory_slack_gib`."""

    max_error_ratio: float = MAX_ERROR_RATIO
    max_ttft_ratio: float = MAX_TTFT_RATIO
    ttft_slack_ms: float = TTFT_SLACK_MS
    min_requests: int = MIN_REQUESTS
    max_itl_ratio: float = MAX_ITL_RATIO
    itl_slack_ms: float = ITL_SLACK_MS
    max_queue_ratio: float = MAX_QUEUE_RATIO
    queue_slack: float = QUEUE_SLACK
    kv_usage_rise: float = KV_USAGE_RISE
    max_gpu_memory_ratio: float = MAX_GPU_MEMORY_RATIO
    gpu_memory_slack_gib: float = GPU_MEMORY_SLACK_GIB

    def figure_rules(self) -> tuple[FigureRule, ...]:
        """The rule of each figure judged beyond errors and TTFT, in the order a verdict names them."""
        return (
            FigureRule(
                "itl_p99_ms",
                "ITL p99",
                "ms",
                self.max_itl_ratio,
                self.itl_slack_ms,
                "max_itl_ratio",
                "itl_slack_ms",
            ),
            FigureRule(
                "queue_waiting",
                "queue depth (vllm:num_requests_waiting, mean per engine)",
                "requests",
                self.max_queue_ratio,
                self.queue_slack,
                "max_queue_ratio",
                "queue_slack",
            ),
            FigureRule(
                "kv_usage",
                "KV cache utilization (vllm:kv_cache_usage_perc, mean per engine)",
                "of the cache",
                1.0,
                self.kv_usage_rise,
                "no ratio",
                "kv_usage_rise",
            ),
            FigureRule(
                "gpu_memory_gib",
                "GPU memory held (per engine, the window's highest)",
                "GiB",
                self.max_gpu_memory_ratio,
                self.gpu_memory_slack_gib,
                "max_gpu_memory_ratio",
                "gpu_memory_slack_gib",
            ),
        )


class WindowVerdict(WireModel):
    verdict: Verdict
    reason: str
    window: WindowSummary
    baseline: WindowSummary | None = None
    # each figure judged beyond errors and TTFT: observed, baseline, limit, rule (window_figures.py)
    figures: list[FigureCheck] = Field(default_factory=list)


def figure_checks(
    window: WindowSummary, baseline: WindowSummary | None, limits: WindowThresholds
) -> list[FigureCheck]:
    """ITL p99, queue depth, KV utilization and GPU memory of the window against the baseline's."""
    checks = []
    for rule in limits.figure_rules():
        observed = getattr(window, rule.figure)
        before = getattr(baseline, rule.figure) if baseline is not None else None
        unmeasured = window.unmeasured.get(rule.figure, f"the {window.source} window has no {rule.figure}")
        if baseline is None:
            no_baseline = "no baseline to compare with"
        else:
            no_baseline = baseline.unmeasured.get(rule.figure, f"the baseline has no {rule.figure}")
            no_baseline = f"the baseline's is not measured ({no_baseline})"
        checks.append(check_figure(rule, observed, before, unmeasured, no_baseline))
    return checks


def compare_windows(
    window: WindowSummary, baseline: WindowSummary | None, limits: WindowThresholds
) -> WindowVerdict:
    """The window against its baseline: failed when its error ratio, TTFT p99, ITL p99, queue depth,
    KV utilization or GPU memory is worse than the thresholds allow (the reason names each such figure,
    its baseline and its limit), inconclusive when it holds too few requests to judge, passed
    otherwise. Without a baseline (or one too small to compare) the error ratio is held to
    `max_error_ratio` alone and the other figures are not judged; a figure either side does not
    measure is named not measured (`figures`), never passed."""
    if window.requests < limits.min_requests:
        return WindowVerdict(
            verdict=INCONCLUSIVE,
            reason=f"{window.requests} requests in {window.seconds:g}s, fewer than the {limits.min_requests} "
            "needed to judge",
            window=window,
            baseline=baseline,
        )
    usable = baseline if baseline is not None and baseline.requests >= limits.min_requests else None
    problems: list[str] = []
    notes: list[str] = []
    if window.error_ratio is not None:
        floor = usable.error_ratio if usable is not None and usable.error_ratio is not None else 0.0
        allowed = floor + limits.max_error_ratio
        if window.error_ratio > allowed:
            problems.append(
                f"error ratio {window.error_ratio:.3f} ({window.errors}/{window.requests}) against "
                f"{floor:.3f} for the baseline, more than the {limits.max_error_ratio:g} allowed above it"
            )
        else:
            notes.append(f"error ratio {window.error_ratio:.3f} (baseline {floor:.3f})")
    else:
        notes.append("errors not measured by this source")
    now, before = window.ttft_p99_ms, usable.ttft_p99_ms if usable is not None else None
    if now is not None and before is not None and before > 0:
        ratio = now / before
        if ratio > limits.max_ttft_ratio and now - before > limits.ttft_slack_ms:
            problems.append(
                f"TTFT p99 {now:.1f} ms against {before:.1f} ms for the baseline (×{ratio:.2f}, more than "
                f"×{limits.max_ttft_ratio:g})"
            )
        else:
            notes.append(f"TTFT p99 {now:.1f} ms (baseline {before:.1f} ms, ×{ratio:.2f})")
    elif now is not None:
        notes.append(f"TTFT p99 {now:.1f} ms (no baseline to compare with)")
    figures = figure_checks(window, usable, limits)
    problems += [f.reason for f in figures if f.failed]
    notes += [f.reason for f in figures]
    verdict: Verdict = FAILED if problems else PASSED
    return WindowVerdict(
        verdict=verdict,
        reason="; ".join(problems or notes),
        window=window,
        baseline=baseline,
        figures=figures,
    )
