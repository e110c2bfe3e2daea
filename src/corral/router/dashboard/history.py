"""The last 15 minutes of each model's and each engine's figures, kept by the router for the
dashboard's charts: one point every `step` seconds (5) per series, in fixed rings.

A point is taken from the fleet view (`/v1/fleet`'s body, every worker's with `--workers N`) at each
tick, whether or not a dashboard is open: the request rate and the error rate, TTFT p50 and p95 and
ITL p50 of the requests that ended in the step (differences of the cumulative per-engine `traffic`),
and the engine's KV-cache usage and requests waiting (its own `/metrics`, as the router last scraped
them: `load`; KV usage from its KV events when the router follows them and does not scrape). A
model's request and error rates are the router's own count per model name (`model_requests`), so
they hold whichever engine served the requests and do not drop when an engine leaves; its TTFT and
ITL are those of the engines serving it, its KV usage their mean, its waiting their sum.

Memory is bounded whatever the fleet: `ENGINES_CHARTED` engines and `MODELS_CHARTED` models have
rings (`SERIES` × `points` doubles each); an engine listed when every ring is taken has none (it is
counted as `engines_uncharted`), and a ring whose engine has left stays, so its chart shows the
engine going, until its points have all aged out or a listed engine needs it. Beside the rings, the
last cumulative reading of each listed engine (for its next difference) and of each model's count.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from typing import Any

from corral.contracts.traffic import LatencyHistogram
from corral.router.dashboard.windows import Counted, model_counts

STEP_SECONDS = 5.0
SPAN_SECONDS = 900.0
ENGINES_CHARTED = 64
MODELS_CHARTED = 32
# per step: requests/s, errors/s, TTFT p50 and p95 (ms), ITL p50 (ms), KV usage (0..1), requests waiting
SERIES = ("rate", "errors", "ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms", "kv_usage", "waiting")
_NAN = math.nan


class _Reading:
    """One engine's cumulative figures, as its `traffic` says them."""

    __slots__ = ("errors", "itl", "requests", "ttft")

    def __init__(self, traffic: dict[str, Any]) -> None:
        self.requests = _count(traffic.get("requests"))
        self.errors = _count(traffic.get("errors"))
        self.ttft = _counts(traffic.get("ttft"))
        self.itl = _counts(traffic.get("itl"))

    def minus(self, earlier: _Reading | None) -> _Reading:
        """The figures since `earlier`; whole when there is none or a counter went backwards (the
        engine was listed anew: its counters began again)."""
        if earlier is None or self.requests < earlier.requests:
            return self
        ttft, itl = _diff(self.ttft, earlier.ttft), _diff(self.itl, earlier.itl)
        if ttft is None or itl is None:
            return self
        step = _Reading({})
        step.requests = self.requests - earlier.requests
        step.errors = max(0, self.errors - earlier.errors)
        step.ttft, step.itl = ttft, itl
        return step


class _Ring:
    """One chart subject's points: `len(SERIES)` values per slot, NaN where nothing was known."""

    __slots__ = ("name", "present", "seen", "values")

    def __init__(self, points: int, name: str) -> None:
        self.values = array("d", [_NAN]) * (points * len(SERIES))
        self.name = name
        self.present = True
        self.seen = 0  # the tick that last wrote a point of its own

    def write(self, slot: int, values: Iterable[float]) -> None:
        at = slot * len(SERIES)
        for k, value in enumerate(values):
            self.values[at + k] = value

    def series(self, slots: list[int]) -> dict[str, list[float | None]]:
        width = len(SERIES)
        return {
            name: [_shown(self.values[slot * width + k]) for slot in slots] for k, name in enumerate(SERIES)
        }


class _Model:
    """One model's step, gathered over the engines serving it."""

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.ttft: list[list[int]] = []
        self.itl: list[list[int]] = []
        self.kv: list[float] = []
        self.waiting: float | None = None
        self.adapters: set[str] = set()

    def add(self, adapters: set[str], step: _Reading | None, kv: float | None, waiting: float | None) -> None:
        """One engine serving the model: its step (None on the first point), KV usage and queue."""
        self.adapters |= adapters
        if step is not None and step is not _IDLE:
            self.requests += step.requests
            self.errors += step.errors
            self.ttft.append(step.ttft)
            self.itl.append(step.itl)
        if kv is not None:
            self.kv.append(kv)
        if waiting is not None:
            self.waiting = (self.waiting or 0.0) + waiting


class FleetHistory:
    """Rings of per-model and per-engine points; `sample` takes one, `to_json` answers the charts."""

    def __init__(
        self,
        step: float = STEP_SECONDS,
        span: float = SPAN_SECONDS,
        engines: int = ENGINES_CHARTED,
        models: int = MODELS_CHARTED,
    ) -> None:
        if step <= 0 or span < step:
            raise ValueError(f"step {step} s and span {span} s: need 0 < step ≤ span")
        self.step = step
        self.span = span
        self.points = round(span / step)
        self.engines_charted = engines
        self.models_charted = models
        self._times = array("d", [_NAN]) * self.points  # the router's wall clock of each slot
        self._ticks = 0
        self._engines: dict[str, _Ring] = {}
        self._models: dict[str, _Ring] = {}
        # each listed engine's last `traffic` body, and its reading once one was needed
        self._last: dict[str, tuple[dict[str, Any], _Reading | None]] = {}
        self._counted: Counted | None = None
        self._last_at: float | None = None  # monotonic time of the last sample
        self.engines_uncharted = 0

    def sample(self, fleet: dict[str, Any], wall: float, now: float) -> None:
        """One point from `fleet` (a `/v1/fleet` body) read at `wall` (time.time()) and `now`
        (monotonic). The first point has no rates: they need a previous reading."""
        seconds = None if self._last_at is None else now - self._last_at
        self._last_at = now
        slot = self._ticks % self.points
        self._ticks += 1
        self._times[slot] = wall
        models = self._sample_engines(fleet, slot, seconds)
        self._sample_models(fleet, models, slot, seconds)
        self._forget_aged()

    def _sample_engines(self, fleet: dict[str, Any], slot: int, seconds: float | None) -> dict[str, _Model]:
        """Each listed engine's point (those with a ring), gathered per model on the way."""
        readings: dict[str, tuple[dict[str, Any], _Reading | None]] = {}
        models: dict[str, _Model] = {}
        uncharted = 0
        listed = [
            e for e in fleet.get("endpoints") or () if isinstance(e, dict) and isinstance(e.get("url"), str)
        ]
        urls = {e["url"] for e in listed}
        for url, ring in self._engines.items():  # a ring whose engine has left can go to a listed one
            ring.present = url in urls
        for e in listed:
            url = e["url"]
            traffic = e.get("traffic")
            traffic = traffic if isinstance(traffic, dict) else {}
            since, reading = _step(traffic, self._last.get(url))
            readings[url] = (traffic, reading)
            step = since if seconds else None  # the first point has no step: nothing to difference
            kv, waiting = _load(e)
            charted = self._ring_for(url, str(e.get("name") or url))
            if charted is None:
                uncharted += 1
            else:
                charted.write(slot, _point(step, seconds, kv, waiting))
                charted.seen = self._ticks
            adapters = {a for a in e.get("adapters") or () if isinstance(a, str)}
            for model in e.get("models") or ():
                if model in adapters or not isinstance(model, str):
                    continue
                models.setdefault(model, _Model()).add(adapters, step, kv, waiting)
        self._last = readings  # an engine gone is forgotten here; its ring stays until it ages out
        self.engines_uncharted = uncharted
        for ring in self._engines.values():
            if not ring.present:
                ring.write(slot, [_NAN] * len(SERIES))
        return models

    def _sample_models(
        self, fleet: dict[str, Any], models: dict[str, _Model], slot: int, seconds: float | None
    ) -> None:
        """Each model's point: its engines' figures, and its rates from the router's own count."""
        counted = model_counts(fleet)
        before = self._counted or {}
        for model, gathered in models.items():
            ring = self._models.get(model)
            if ring is None and len(self._models) < self.models_charted:
                ring = self._models[model] = _Ring(self.points, model)
            if ring is None:
                continue
            if counted is not None and seconds:  # the router's own count: it outlives any engine
                steps = [_since(counted.get(n), before.get(n)) for n in (model, *gathered.adapters)]
                gathered.requests = sum(r for r, _ in steps)
                gathered.errors = sum(e for _, e in steps)
            ring.write(slot, _model_point(gathered, seconds))
            ring.seen = self._ticks
        for model, ring in self._models.items():
            ring.present = model in models
            if not ring.present:
                ring.write(slot, [_NAN] * len(SERIES))
        self._counted = counted

    def _ring_for(self, url: str, name: str) -> _Ring | None:
        ring = self._engines.get(url)
        if ring is not None:
            ring.name = name
            return ring
        if len(self._engines) >= self.engines_charted:
            gone = [(r.seen, u) for u, r in self._engines.items() if not r.present]
            if not gone:
                return None
            del self._engines[min(gone)[1]]  # the engine that left longest ago gives its ring up
        ring = self._engines[url] = _Ring(self.points, name)
        return ring

    def _forget_aged(self) -> None:
        """Rings with no point of their own left in the span."""
        for rings in (self._engines, self._models):
            for key in [k for k, r in rings.items() if self._ticks - r.seen >= self.points]:
                del rings[key]

    def to_json(self) -> dict[str, Any]:
        """`GET /dashboard/series`: the points oldest first (`times` in the router's wall-clock
        seconds), per model and per engine (by URL, with its name and whether it is listed now)."""
        held = min(self._ticks, self.points)
        slots = [(self._ticks - held + i) % self.points for i in range(held)]
        return {
            "step_s": self.step,
            "span_s": self.span,
            "series": list(SERIES),
            "times": [self._times[slot] for slot in slots],
            "models": {m: r.series(slots) for m, r in sorted(self._models.items())},
            "engines": {
                url: {"name": r.name, "present": r.present, **r.series(slots)}
                for url, r in sorted(self._engines.items(), key=lambda item: item[1].name)
            },
            "engines_uncharted": self.engines_uncharted,
        }


def _step(
    traffic: dict[str, Any], earlier: tuple[dict[str, Any], _Reading | None] | None
) -> tuple[_Reading, _Reading | None]:
    """An engine's figures since its last reading, and its reading now (None while it is idle: an idle
    engine costs one comparison of its body with the last)."""
    if earlier is not None and earlier[0] == traffic:
        return _IDLE, earlier[1]
    reading = _Reading(traffic)
    before = None if earlier is None else earlier[1] or _Reading(earlier[0])
    return reading.minus(before), reading


def _point(
    step: _Reading | None, seconds: float | None, kv: float | None, waiting: float | None
) -> list[float]:
    rates = _rates(step.requests, step.errors, step.ttft, step.itl, seconds) if step is not None else None
    return [*(rates or [_NAN] * 5), _NAN if kv is None else kv, _NAN if waiting is None else waiting]


def _model_point(gathered: _Model, seconds: float | None) -> list[float]:
    ttft, itl = _added(gathered.ttft), _added(gathered.itl)
    rates = _rates(gathered.requests, gathered.errors, ttft, itl, seconds)
    kv = sum(gathered.kv) / len(gathered.kv) if gathered.kv else _NAN
    waiting = _NAN if gathered.waiting is None else gathered.waiting
    return [*(rates or [_NAN] * 5), kv, waiting]


def _rates(
    requests: int, errors: int, ttft: list[int], itl: list[int], seconds: float | None
) -> list[float] | None:
    """Requests/s, errors/s, TTFT p50 and p95 and ITL p50 in ms of one step; None without a length."""
    if not seconds:
        return None
    # built unvalidated: the counts are this module's own non-negative ints (a tick holds up to 96 of them)
    first = LatencyHistogram.model_construct(counts=ttft, sum=0.0)
    gaps = LatencyHistogram.model_construct(counts=itl, sum=0.0)
    return [requests / seconds, errors / seconds, _ms(first, 0.5), _ms(first, 0.95), _ms(gaps, 0.5)]


def _ms(histogram: LatencyHistogram, q: float) -> float:
    value = histogram.quantile(q)
    return _NAN if value is None else value * 1000


def _added(parts: list[list[int]]) -> list[int]:
    width = max((len(p) for p in parts), default=0)
    total = [0] * width
    for part in parts:
        for i, n in enumerate(part):
            total[i] += n
    return total


def _since(now: tuple[int, int] | None, before: tuple[int, int] | None) -> tuple[int, int]:
    requests, errors = now or (0, 0)
    if before is None or before[0] > requests:  # a name first counted in this step
        return requests, errors
    return requests - before[0], max(0, errors - before[1])


def _load(endpoint: dict[str, Any]) -> tuple[float | None, float | None]:
    """(KV usage 0..1, requests waiting) as the router last read them from the engine; None unknown."""
    load = endpoint.get("load")
    kv = waiting = None
    if isinstance(load, dict):
        kv = _number(load.get("kv_usage"))
        waiting = _number(load.get("waiting"))
    events = endpoint.get("kv_events")
    if kv is None and isinstance(events, dict):
        kv = _number(events.get("usage"))
    return kv, waiting


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _counts(latency: Any) -> list[int]:
    # the router's own view (its endpoints' histograms, its sibling workers'): lists of ints, taken as is
    counts = latency.get("counts") if isinstance(latency, dict) else None
    return counts if isinstance(counts, list) else []


def _diff(now: list[int], earlier: list[int]) -> list[int] | None:
    """Bucket counts since `earlier`; None when a bucket went backwards (histograms only grow)."""
    if len(now) < len(earlier):  # counts travel without trailing zeros: a later one is never shorter
        return None
    diff = [a - b for a, b in zip(now, earlier, strict=False)]
    if diff and min(diff) < 0:
        return None
    return diff + now[len(earlier) :]


def _shown(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)


_IDLE = _Reading({})  # the step of an engine whose figures did not change
