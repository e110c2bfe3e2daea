"""Per-model request rate, error share and time to first token over a sliding window (60 s), for
the dashboard.

The fleet view's per-endpoint `traffic` figures are cumulative; a window is the difference between
the current reading and one taken `window` seconds earlier (`TrafficFigures.minus`), summed over the
engines that serve each model. Readings are kept every `sample_every` seconds and only for as long
as the window needs, so the memory is a few readings per endpoint, and figures need the feed's loop
only (it runs while a dashboard is open): until a dashboard has been open for the whole window, the
window is the time it has been open (`covered_s`, whole seconds, at most `window_s`).

The router counts traffic per engine, not per model, so the figures are per base model: those of
the engines serving it, and the requests for its LoRA adapters on those engines count toward it (each
model's `adapters` names them). In a fleet where each engine serves one base model, that is exact.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from corral.contracts.traffic import TrafficFigures

WINDOW_SECONDS = 60.0
SAMPLE_EVERY = 5.0

Reading = dict[str, dict[str, Any]]  # endpoint URL -> its cumulative `traffic` body


class ModelWindows:
    """Readings of every endpoint's cumulative traffic; `update` answers the windowed figures."""

    def __init__(self, window: float = WINDOW_SECONDS, sample_every: float = SAMPLE_EVERY) -> None:
        if window <= 0 or sample_every <= 0 or sample_every > window:
            raise ValueError(f"window {window} s and sample_every {sample_every} s: need 0 < sample ≤ window")
        self.window = window
        self.sample_every = sample_every
        self._readings: deque[tuple[float, Reading]] = deque()

    def clear(self) -> None:
        """Forget every reading (nobody watches: the next view starts a fresh window)."""
        self._readings.clear()

    def update(self, fleet: dict[str, Any], now: float) -> dict[str, Any]:
        """Take `fleet` (a `/v1/fleet` body) as read at `now` (monotonic seconds); the figures of the
        window that ends now: `{"window_s", "covered_s", "models": {model: figures}}`."""
        endpoints = [e for e in fleet.get("endpoints") or () if isinstance(e, dict) and e.get("url")]
        current: Reading = {e["url"]: e["traffic"] for e in endpoints if isinstance(e.get("traffic"), dict)}
        readings = self._readings
        if not readings or now - readings[-1][0] >= self.sample_every:
            readings.append((now, current))
        # the baseline: the newest reading at least a window old (or the oldest there is)
        while len(readings) > 1 and readings[1][0] <= now - self.window:
            readings.popleft()
        since, baseline = readings[0]
        covered = now - since
        # what the page says: changes with each sample, not each read (an idle view pushes nothing)
        shown = min(self.window, round(readings[-1][0] - since))
        windows = {url: _window(traffic, baseline.get(url)) for url, traffic in current.items()}
        models: dict[str, dict[str, Any]] = {}
        for e in endpoints:
            window = windows.get(e["url"])
            adapters = set(e.get("adapters") or ())  # absent from a router before issue 18
            for model in e.get("models") or ():
                if model in adapters:
                    continue
                total = models.setdefault(
                    model, {"requests": 0, "errors": 0, "ttft": None, "adapters": set()}
                )
                total["adapters"] |= adapters
                if window is None:
                    continue
                total["requests"] += window.requests
                total["errors"] += window.errors or 0
                total["ttft"] = window if total["ttft"] is None else total["ttft"].plus(window)
        return {
            "window_s": self.window,
            "covered_s": shown,
            "models": {m: _figures(t, covered) for m, t in sorted(models.items())},
        }


def _window(traffic: dict[str, Any], earlier: dict[str, Any] | None) -> TrafficFigures | None:
    """One endpoint's figures inside the window; None when nothing happened there (the common case,
    checked without building a model). An endpoint new since the baseline counts whole: its
    counters began when the router listed it."""
    if earlier == traffic:
        return None
    later = TrafficFigures.model_validate(traffic)
    return later if earlier is None else later.minus(TrafficFigures.model_validate(earlier))


def _figures(total: dict[str, Any], covered: float) -> dict[str, Any]:
    requests, errors = total["requests"], total["errors"]
    ttft = total["ttft"].ttft if total["ttft"] is not None else None
    count = ttft.count if ttft is not None else 0

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1000, 1)

    return {
        "adapters": sorted(total["adapters"]),
        "requests": requests,
        "rate": round(requests / covered, 3) if covered > 0 else None,
        "errors": errors,
        "error_share": round(errors / requests, 4) if requests else None,
        "ttft_count": count,
        "ttft_mean_ms": ms(ttft.sum / count) if ttft is not None and count else None,
        "ttft_p95_ms": ms(ttft.quantile(0.95)) if ttft is not None else None,
    }
