"""What the supervisor reads from the engine's own `/metrics`: a `LoadSample` (requests running and
waiting, requests finished, tokens generated), the evidence behind stall detection and the drain's
quiet period.

`arrivals` is derived, not counted: running + waiting + finished only grows when a request reaches
the engine, so its increase between two samples is a lower bound on the requests that arrived.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import aiohttp

from corral.engine.metric_names import FINISHED, GENERATION_TOKENS, RUNNING, WAITING
from corral.engine.metrics_text import samples


@dataclass(frozen=True)
class LoadSample:
    running: float
    waiting: float
    finished: float
    generation_tokens: float
    at: float

    @property
    def in_flight(self) -> float:
        return self.running + self.waiting

    @property
    def admitted(self) -> float:
        """Every request the engine has taken in and not lost (aborted requests drop out)."""
        return self.running + self.waiting + self.finished

    def to_json(self) -> dict[str, float]:
        return {
            "running": self.running,
            "waiting": self.waiting,
            "finished": self.finished,
            "generation_tokens": self.generation_tokens,
        }


def parse_load(text: str, at: float | None = None) -> LoadSample:
    """Sums each metric over its label sets (engines, models, finish reasons)."""
    totals = {RUNNING: 0.0, WAITING: 0.0, GENERATION_TOKENS: 0.0, FINISHED: 0.0}
    for sample in samples(text, totals.keys(), strict=True):
        totals[sample.name] += sample.value
    return LoadSample(
        running=totals[RUNNING],
        waiting=totals[WAITING],
        finished=totals[FINISHED],
        generation_tokens=totals[GENERATION_TOKENS],
        at=time.monotonic() if at is None else at,
    )


class MetricsUnavailable(Exception):
    """The engine did not answer `/metrics` with 200 and parseable text."""


async def fetch_metrics_text(session: aiohttp.ClientSession, engine_url: str, within: float = 2.0) -> str:
    """The engine's `/metrics` text; raises MetricsUnavailable when it does not answer 200."""
    try:
        async with session.get(engine_url + "/metrics", timeout=aiohttp.ClientTimeout(total=within)) as resp:
            if resp.status != 200:
                raise MetricsUnavailable(f"/metrics answered HTTP {resp.status}")
            return await resp.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise MetricsUnavailable(f"/metrics: {type(exc).__name__}: {exc}") from exc


async def fetch_load(session: aiohttp.ClientSession, engine_url: str, within: float = 2.0) -> LoadSample:
    text = await fetch_metrics_text(session, engine_url, within)
    try:
        return parse_load(text)
    except ValueError as exc:
        raise MetricsUnavailable(f"/metrics is not Prometheus text: {exc}") from exc
