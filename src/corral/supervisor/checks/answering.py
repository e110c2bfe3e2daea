"""Whether a READY engine still answers at all: its `/health`, asked once a probe period.

This is not the stall rule (checks/stall.py). An engine whose `/health` answers 200 while its core is
hung is the stall rule's, after `--stall-seconds`. This rule is about an engine that answers nothing:
a frozen process (SIGSTOP, a GPU hang, a wedged driver call or collective blocking the API server), a
dead core whose `/health` says 503, a listener gone. After `--unanswered-seconds` without a 200 the
engine is withdrawn from routing (lifecycle/not_answering.py) but not failed: failing and restarting
stays with the stall rule.

`AnswerRule` is the pure rule, fed one `HealthProbe` at a time. `probe_health` asks the engine once.
A probe may take the time left before the limit, never less than one period, so an engine that answers
slowly (a loaded API server) is not mistaken for one that answers nothing: only silence for the whole
limit withdraws it.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import aiohttp

# How often /health is asked; the withdrawal limit is a number of these (5 s: five periods).
PROBE_PERIOD_SECONDS = 1.0
# The last unanswered probes kept as evidence (their count is kept whole).
PROBES_KEPT = 8


@dataclass(frozen=True)
class HealthProbe:
    """One `GET /health`: when it was sent (time.monotonic()), how long it took, what came back."""

    at: float
    seconds: float
    status: int | None  # None: no HTTP answer at all
    error: str | None = None  # "timed out after 5 s", "ClientConnectorError: …"

    @property
    def answered(self) -> bool:
        return self.status == 200

    @property
    def timed_out(self) -> bool:
        return self.status is None and self.error is not None and self.error.startswith("timed out")

    @property
    def words(self) -> str:
        return f"HTTP {self.status}" if self.status is not None else str(self.error)

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "answer": self.words}


@dataclass(frozen=True)
class Unanswered:
    """Why the engine is judged not answering, and the probes that show it."""

    reason: str
    evidence: dict[str, Any]


class AnswerRule:
    """Says when `/health` has not answered 200 for `limit` seconds. `answered_at` starts at the moment
    the engine was last known to answer (READY is earned by a smoke request)."""

    def __init__(self, limit: float, answered_at: float, period: float = PROBE_PERIOD_SECONDS) -> None:
        if limit <= 0:
            raise ValueError(f"the unanswered limit must be positive seconds, not {limit!r}")
        self.limit = limit
        self.period = min(period, limit)
        self.answered_at = answered_at
        self.last_answer: str | None = None  # "HTTP 200" once a probe of this rule was answered
        self.unanswered = 0  # probes since the last answer
        self.timeouts = 0
        self.recent: deque[HealthProbe] = deque(maxlen=PROBES_KEPT)

    def timeout_for(self, now: float) -> float:
        """How long the probe sent now may wait: the time left before the limit, at least one period."""
        return max(self.period, self.answered_at + self.limit - now)

    def observe(self, probe: HealthProbe) -> Unanswered | None:
        ended = probe.at + probe.seconds
        if probe.answered:
            self.answered_at = ended
            self.last_answer = probe.words
            self.unanswered = self.timeouts = 0
            self.recent.clear()
            return None
        self.unanswered += 1
        self.timeouts += probe.timed_out
        self.recent.append(probe)
        silent = ended - self.answered_at
        if silent < self.limit:
            return None
        return Unanswered(
            f"engine not answering: /health has not answered 200 for {silent:.1f}s "
            f"({self.unanswered} probes, {self.timeouts} timed out; last: {probe.words}); "
            f"out of routing until it answers and passes the smoke request "
            f"(--unanswered-seconds {self.limit:g})",
            self.evidence(ended),
        )

    def evidence(self, now: float) -> dict[str, Any]:
        return {
            "unanswered_seconds": round(now - self.answered_at, 3),
            "probes_unanswered": self.unanswered,
            "probes_timed_out": self.timeouts,
            "last_probes": [p.to_json() for p in self.recent],
            "last_answer": self.last_answer or "the smoke request that made it READY",
            "last_answer_wall": round(time.time() - (now - self.answered_at), 3),
            "limit_seconds": self.limit,
        }


async def probe_health(session: aiohttp.ClientSession, engine_url: str, within: float) -> HealthProbe:
    """`GET /health` once, waiting at most `within` seconds; never raises for the engine's sake."""
    started = time.monotonic()
    try:
        async with session.get(engine_url + "/health", timeout=aiohttp.ClientTimeout(total=within)) as resp:
            await resp.read()
            return HealthProbe(started, time.monotonic() - started, resp.status)
    except TimeoutError:
        error = f"timed out after {within:.1f}s"
    except aiohttp.ClientError as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    return HealthProbe(started, time.monotonic() - started, None, error)
