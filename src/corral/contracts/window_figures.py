"""The figures a traffic window is judged on beyond its error ratio and TTFT: ITL p99, queue depth, KV
cache utilization and GPU memory, each held to one rule against its baseline, and the verdict of each
(`FigureCheck`: the figure, its baseline, the observed value, the limit and the rule that gave it).

One rule for every figure: the window's value may reach `max(baseline × ratio, baseline + slack)`, no
more. The ratio catches a figure that grows with the load (ITL doubling), the slack keeps a near-zero
baseline from failing on noise (a queue of 0 becoming 2, a 2 ms ITL becoming 5 ms) and gives a zero
baseline a limit at all. A figure the source does not measure, or with no baseline to compare with, is
`not_measured`, named in the verdict, never a pass; so is a value that is no figure (NaN, infinite,
negative: what a broken exporter may send).

The gauges (queue depth, KV utilization, GPU memory) are read several times over a window (`GaugeWindow`);
the window keeps the mean of the queue and KV readings (one burst is not a trend) and the highest GPU
memory (memory that grew once is held). A group's reading is one engine's: the mean over its engines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from corral.contracts.wire import WireModel

GIB = 2**30
FigureOutcome = Literal["passed", "failed", "not_measured"]
FIGURE_PASSED: FigureOutcome = "passed"
FIGURE_FAILED: FigureOutcome = "failed"
NOT_MEASURED: FigureOutcome = "not_measured"


class FigureCheck(WireModel):
    """One figure of a window against its baseline: what the verdict quotes and a record keeps."""

    figure: str  # itl_p99_ms | queue_waiting | kv_usage | gpu_memory_gib
    outcome: FigureOutcome
    observed: float | None
    baseline: float | None
    limit: float | None  # the highest observed value allowed against this baseline
    rule: str  # how the limit was made, with the thresholds' names
    reason: str

    @property
    def failed(self) -> bool:
        return self.outcome == FIGURE_FAILED


@dataclass(frozen=True)
class FigureRule:
    """`figure` (its name in a `WindowSummary`), how it reads (`label`, `unit`), and its thresholds:
    `ratio` and `slack` with the names a user sets them by."""

    figure: str
    label: str
    unit: str
    ratio: float
    slack: float
    ratio_name: str
    slack_name: str

    def limit(self, baseline: float) -> float:
        return max(baseline * self.ratio, baseline + self.slack)

    def describe(self) -> str:
        return (
            f"at most ×{self.ratio:g} the baseline ({self.ratio_name}) or the baseline + {self.slack:g} "
            f"{self.unit} ({self.slack_name}), whichever is higher"
        )


def check_figure(
    rule: FigureRule, observed: float | None, baseline: float | None, unmeasured: str, no_baseline: str
) -> FigureCheck:
    """`observed` against `baseline` by `rule`. `unmeasured` says why an absent `observed` is absent,
    `no_baseline` why an absent baseline is; either makes the figure not_measured."""

    def made(outcome: FigureOutcome, limit: float | None, reason: str) -> FigureCheck:
        return FigureCheck(
            figure=rule.figure,
            outcome=outcome,
            observed=observed,
            baseline=baseline,
            limit=limit,
            rule=rule.describe(),
            reason=reason,
        )

    if observed is not None and not (math.isfinite(observed) and observed >= 0):
        observed, unmeasured = None, f"the source gave {observed!r}, not a figure to judge"
    if baseline is not None and not (math.isfinite(baseline) and baseline >= 0):
        baseline, no_baseline = None, f"the baseline's is {baseline!r}, not a figure to compare with"
    if observed is None:
        return made(NOT_MEASURED, None, f"{rule.label} not measured: {unmeasured}")
    shown = f"{rule.label} {observed:.4g} {rule.unit}"
    if baseline is None:
        return made(NOT_MEASURED, None, f"{shown}, not judged: {no_baseline}")
    limit = rule.limit(baseline)
    against = f"against {baseline:.4g} {rule.unit} for the baseline"
    if observed > limit:
        why = f"more than the {limit:.4g} {rule.unit} allowed ({rule.describe()})"
        return made(FIGURE_FAILED, limit, f"{shown} {against}, {why}")
    return made(FIGURE_PASSED, limit, f"{shown} ({against}, limit {limit:.4g})")


@dataclass(frozen=True)
class GaugeReading:
    """One reading of an engine's gauges (a group's: `per_engine`); None: the source does not show it.
    `waiting`: `vllm:num_requests_waiting` (summed over a vLLM's data-parallel engines); `kv_usage`:
    `vllm:kv_cache_usage_perc` (0-1, the highest of its data-parallel engines); `gpu_memory_bytes`:
    what the engine holds on its GPUs (NVML, or the simulator's own gauge)."""

    waiting: float | None = None
    kv_usage: float | None = None
    gpu_memory_bytes: float | None = None

    @classmethod
    def per_engine(cls, engines: list[GaugeReading]) -> GaugeReading:
        """Several engines' readings as one engine's, the mean of each figure, so that groups of
        different sizes compare (a canary's one new engine against three old ones) and one engine
        stands out against its fleet."""
        return cls(
            _mean([e.waiting for e in engines]),
            _mean([e.kv_usage for e in engines]),
            _mean([e.gpu_memory_bytes for e in engines]),
        )


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _highest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass
class GaugeWindow:
    """The gauge readings taken over one window: the mean queue and KV utilization, the highest GPU
    memory reading, and why a figure is missing where no reading had it (`unmeasured`)."""

    readings: int = 0
    _waiting: list[float] = field(default_factory=list)
    _kv: list[float] = field(default_factory=list)
    gpu_memory_bytes: float | None = None
    unmeasured: dict[str, str] = field(default_factory=dict)

    def add(self, reading: GaugeReading) -> None:
        self.readings += 1
        if reading.waiting is not None:
            self._waiting.append(reading.waiting)
        if reading.kv_usage is not None:
            self._kv.append(reading.kv_usage)
        self.gpu_memory_bytes = _highest(self.gpu_memory_bytes, reading.gpu_memory_bytes)

    def note(self, figure: str, why: str) -> None:
        """Why `figure` could not be read (kept once; a figure read at all drops it)."""
        self.unmeasured.setdefault(figure, why)

    @property
    def waiting(self) -> float | None:
        return round(sum(self._waiting) / len(self._waiting), 3) if self._waiting else None

    @property
    def kv_usage(self) -> float | None:
        return round(sum(self._kv) / len(self._kv), 4) if self._kv else None

    @property
    def gpu_memory_gib(self) -> float | None:
        return None if self.gpu_memory_bytes is None else round(self.gpu_memory_bytes / GIB, 3)

    def why_unmeasured(self) -> dict[str, str]:
        """Each missing figure's reason: what was noted, else that no reading showed it."""
        values = {
            "queue_waiting": self.waiting,
            "kv_usage": self.kv_usage,
            "gpu_memory_gib": self.gpu_memory_gib,
        }
        fallback = f"none of the {self.readings} readings showed it" if self.readings else "no gauge was read"
        return {name: self.unmeasured.get(name, fallback) for name, value in values.items() if value is None}
