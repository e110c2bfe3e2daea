"""What a load sent and how each request ended: counts, failures by kind, latencies, and the lines
`corral load` prints from them (one a second, and the summary)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RequestOutcome:
    """One request's end: `failure` is None when it succeeded, else its kind ("HTTP 503", "stream
    cut", "connection error", ...)."""

    seconds: float
    streamed: bool
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile `q` of `values` (NaN when there are none)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f} ms"


@dataclass
class LoadTally:
    """Every request a load started, from the first to the last; `window` holds the requests that
    ended since the last progress line."""

    sent: int = 0
    streamed: int = 0
    ok: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    unfinished: int = 0  # still in flight when a Ctrl-C's grace ran out: neither ok nor failed
    latencies: list[float] = field(default_factory=list)
    window: list[RequestOutcome] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    @property
    def in_flight(self) -> int:
        return self.sent - self.ok - self.failed - self.unfinished

    def started(self, streamed: bool) -> None:
        self.sent += 1
        self.streamed += streamed

    def ended(self, outcome: RequestOutcome) -> None:
        if outcome.failure is None:
            self.ok += 1
            self.latencies.append(outcome.seconds)
        else:
            self.failures[outcome.failure] += 1
        self.window.append(outcome)

    def failure_kinds(self) -> str:
        """ "HTTP 503 ×3, stream cut ×1", most frequent first."""
        return ", ".join(f"{kind} ×{n}" for kind, n in self.failures.most_common())

    def progress_line(self, elapsed: float, window_seconds: float) -> str:
        """One second's line: totals so far, and the rate and latencies of the requests that ended in
        the window since the last line (cleared here)."""
        window, self.window = self.window, []
        done = [o.seconds for o in window if o.ok]
        rate = len(window) / window_seconds if window_seconds > 0 else 0.0
        return (
            f"{elapsed:5.0f}s  sent {self.sent}  ok {self.ok}  failed {self.failed}  "
            f"in flight {self.in_flight}  {rate:.1f} req/s  "
            f"p50 {_ms(quantile(done, 0.5))}  p99 {_ms(quantile(done, 0.99))}"
        )

    def summary_line(self, elapsed: float, stopped_by_user: bool) -> str:
        """The last line: what was sent, how many failed and how (each kind), the overall latencies."""
        rate = (self.ok + self.failed) / elapsed if elapsed > 0 else 0.0
        how = "stopped by Ctrl-C" if stopped_by_user else "done"
        line = (
            f"load {how}: sent {self.sent} in {elapsed:.1f}s ({rate:.1f} req/s, {self.streamed} streamed), "
            f"ok {self.ok}, failed {self.failed}"
        )
        if self.failures:
            line += f" ({self.failure_kinds()})"
        if self.unfinished:
            line += f", {self.unfinished} unfinished at Ctrl-C"
        return (
            line + f"; latency p50 {_ms(quantile(self.latencies, 0.5))}, "
            f"p99 {_ms(quantile(self.latencies, 0.99))}"
        )
