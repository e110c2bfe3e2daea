"""Per-model request rate, error share and time to first token over a sliding window (60 s), for
the dashboard.

The fleet view's per-endpoint `traffic` figures are cumulative; a window is the difference between
the current reading and one taken `window` seconds earlier (counted as `TrafficFigures.minus` does),
summed over the engines that serve each model. Readings are kept every `sample_every` seconds and
only for as long as the window needs, so the memory is a few readings per endpoint, and figures need
the feed's loop only (it runs while a dashboard is open): until a dashboard has been open for the
whole window, the window is the time it has been open (`covered_s`, whole seconds, at most `window_s`).

A model's requests, errors and rate come from the router's own count per model name (`/v1/fleet`'s
`model_requests`: every request the router answered, whichever engine served it, kept when an engine
leaves), so they never go backwards when an engine is retired; `total` is that count since the router
started. Its TTFT is from the per-engine histograms of the engines serving it (a retired engine's
first tokens leave the window with it). A model's LoRA adapters count toward it (each model's
`adapters` names them). A router without `model_requests` (older workers) has its figures summed over
the engines listed now, as before.
"""

from __future__ import annotations

from collections import deque
from itertools import zip_longest
from typing import Any

from corral.contracts.traffic import LatencyHistogram, trimmed

WINDOW_SECONDS = 60.0
SAMPLE_EVERY = 5.0

Reading = dict[str, dict[str, Any]]  # endpoint URL -> its cumulative `traffic` body
Counted = dict[str, tuple[int, int]]  # model name -> (requests, errors) the router answered, cumulative


class ModelWindows:
    """Readings of every endpoint's cumulative traffic; `update` answers the windowed figures."""

    def __init__(self, window: float = WINDOW_SECONDS, sample_every: float = SAMPLE_EVERY) -> None:
        if window <= 0 or sample_every <= 0 or sample_every > window:
            raise ValueError(f"window {window} s and sample_every {sample_every} s: need 0 < sample ≤ window")
        self.window = window
        self.sample_every = sample_every
        self._readings: deque[tuple[float, Reading, Counted | None]] = deque()

    def clear(self) -> None:
        """Forget every reading (nobody watches: the next view starts a fresh window)."""
        self._readings.clear()

    def update(self, fleet: dict[str, Any], now: float) -> dict[str, Any]:
        """Take `fleet` (a `/v1/fleet` body) as read at `now` (monotonic seconds); the figures of the
        window that ends now: `{"window_s", "covered_s", "models": {model: figures}}`."""
        endpoints = [e for e in fleet.get("endpoints") or () if isinstance(e, dict) and e.get("url")]
        current: Reading = {e["url"]: e["traffic"] for e in endpoints if isinstance(e.get("traffic"), dict)}
        counted = model_counts(fleet)
        readings = self._readings
        if not readings or now - readings[-1][0] >= self.sample_every:
            readings.append((now, current, counted))
        # the baseline: the newest reading at least a window old (or the oldest there is)
        while len(readings) > 1 and readings[1][0] <= now - self.window:
            readings.popleft()
        since, baseline, counted_then = readings[0]
        covered = now - since
        # what the page says: changes with each sample, not each read (an idle view pushes nothing)
        shown = min(self.window, round(readings[-1][0] - since))
        windows = {url: _window(traffic, baseline.get(url)) for url, traffic in current.items()}
        models: dict[str, _Total] = {}
        for e in endpoints:
            window = windows.get(e["url"])
            adapters = set(e.get("adapters") or ())  # absent from a router before issue 18
            for model in e.get("models") or ():
                if model in adapters:
                    continue
                total = models.setdefault(model, _Total())
                total.adapters |= adapters
                if window is not None:
                    total.add(window)
        if counted is not None:
            for model, total in models.items():
                names = (model, *total.adapters)
                total.counted(
                    [counted.get(n, (0, 0)) for n in names],
                    [(counted_then or {}).get(n, (0, 0)) for n in names],
                )
        return {
            "window_s": self.window,
            "covered_s": shown,
            "models": {m: t.figures(covered) for m, t in sorted(models.items())},
        }


# One endpoint's window: requests, errors, TTFT counts per `LATENCY_BOUNDS` bucket, TTFT sum.
Window = tuple[int, int, list[int], float]


def _window(traffic: dict[str, Any], earlier: dict[str, Any] | None) -> Window | None:
    """One endpoint's figures inside the window, as `TrafficFigures.minus` counts them but on the
    router's own bodies (a thousand endpoints per read: no model built per endpoint); None when
    nothing happened there. An endpoint new since the baseline counts whole (its counters began
    when the router listed it), and so does one whose counters went backwards (its source restarted)."""
    if earlier == traffic:
        return None
    requests, errors, counts, total = _reading(traffic)
    if earlier is None:
        return requests, errors, counts, total
    e_requests, e_errors, e_counts, e_total = _reading(earlier)
    # per-bucket counts travel without trailing zeros: a later reading of one series is never shorter
    if requests < e_requests or len(counts) < len(e_counts):
        return requests, errors, counts, total
    diff = [n - b for n, b in zip(counts, e_counts, strict=False)]
    if diff and min(diff) < 0:
        return requests, errors, counts, total
    diff += counts[len(e_counts) :]
    return requests - e_requests, max(0, errors - e_errors), diff, max(0.0, total - e_total)


def _reading(traffic: dict[str, Any]) -> Window:
    ttft = traffic.get("ttft") or {}
    counts = ttft.get("counts")
    total = ttft.get("sum")
    return (
        _count(traffic.get("requests")),
        _count(traffic.get("errors")),
        list(counts) if isinstance(counts, list) else [],
        float(total) if isinstance(total, int | float) else 0.0,
    )


def model_counts(fleet: dict[str, Any]) -> Counted | None:
    """`model_requests` of a `/v1/fleet` body as (requests, errors) per model name; None when absent."""
    body = fleet.get("model_requests")
    if not isinstance(body, dict):
        return None
    counts = ((str(m), c) for m, c in body.items() if isinstance(c, dict))
    return {m: (_count(c.get("requests")), _count(c.get("errors"))) for m, c in counts}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class _Total:
    """One model's window: its engines' windows added up (the buckets once, when figures are read)."""

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.parts: list[list[int]] = []
        self.ttft_sum = 0.0
        self.adapters: set[str] = set()
        self.total: int | None = None  # the router's count since it started; None from an older router

    def counted(self, now: list[tuple[int, int]], then: list[tuple[int, int]]) -> None:
        """The router's own counts for the model and its adapters, now and at the window's start,
        in place of the sums over the engines listed now."""
        self.total = sum(r for r, _ in now)
        self.requests = self.total - sum(r for r, _ in then)
        self.errors = sum(e for _, e in now) - sum(e for _, e in then)

    def add(self, window: Window) -> None:
        requests, errors, counts, total = window
        self.requests += requests
        self.errors += errors
        if counts:
            self.parts.append(counts)
        self.ttft_sum += total

    def figures(self, covered: float) -> dict[str, Any]:
        counts = [sum(column) for column in zip_longest(*self.parts, fillvalue=0)]
        ttft = LatencyHistogram(counts=trimmed(counts), sum=self.ttft_sum)
        count = ttft.count

        def ms(seconds: float | None) -> float | None:
            return None if seconds is None else round(seconds * 1000, 1)

        return {
            "adapters": sorted(self.adapters),
            "requests": self.requests,
            "total": self.total,
            "rate": round(self.requests / covered, 3) if covered > 0 else None,
            "errors": self.errors,
            "error_share": round(self.errors / self.requests, 4) if self.requests else None,
            "ttft_count": count,
            "ttft_mean_ms": ms(self.ttft_sum / count) if count else None,
            "ttft_p95_ms": ms(ttft.quantile(0.95)),
        }
