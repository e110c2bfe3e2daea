"""Stall detection for a READY engine, whose `/health` stays 200 while its engine core is hung.

Two pieces of evidence, either one enough: requests running while `vllm:generation_tokens_total` has
not moved for `stall_seconds`; or, when idle, a smoke request that gets no answer within
`stall_seconds`. An engine that stops answering `/metrics` at all for `stall_seconds` is failed too.
`StallDetector` is the pure rule; `StallWatch` feeds it from the engine.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from corral.engine.load_sample import LoadSample, MetricsUnavailable, fetch_load
from corral.supervisor.checks.readiness import NotReady, ReadinessCheck


@dataclass(frozen=True)
class Stall:
    """Why the engine is judged hung, with the numbers that show it."""

    reason: str
    evidence: dict[str, Any]


class StallDetector:
    """Fed one `LoadSample` at a time; says when tokens stopped advancing under load."""

    def __init__(self, stall_seconds: float) -> None:
        self.stall_seconds = stall_seconds
        self._tokens: float | None = None
        self._progress_at: float | None = None  # last time tokens moved or nothing was running

    def observe(self, sample: LoadSample) -> Stall | None:
        advanced = self._tokens is None or sample.generation_tokens != self._tokens
        self._tokens = sample.generation_tokens
        if advanced or sample.running <= 0 or self._progress_at is None:
            self._progress_at = sample.at
            return None
        stuck_for = sample.at - self._progress_at
        if stuck_for < self.stall_seconds:
            return None
        return Stall(
            f"engine stalled: {sample.running:.0f} requests running and no token generated "
            f"for {stuck_for:.1f}s (--stall-seconds {self.stall_seconds:g})",
            {"stuck_seconds": round(stuck_for, 3), **sample.to_json()},
        )

    def idle(self, sample: LoadSample) -> bool:
        return sample.in_flight <= 0


class StallWatch:
    """Polls the engine while READY; `watch()` returns the first Stall it finds, and only then."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        engine_url: str,
        readiness: ReadinessCheck,
        model: str,
        stall_seconds: float,
        poll_seconds: float = 0.5,
    ) -> None:
        self._session = session
        self._engine_url = engine_url
        self._readiness = readiness
        self._model = model
        self.stall_seconds = stall_seconds
        self._poll = min(poll_seconds, stall_seconds / 4)
        self.detector = StallDetector(stall_seconds)
        self.last_sample: LoadSample | None = None
        self.smokes = 0  # idle smoke requests answered: the engine counts them as requests it finished

    async def watch(self) -> Stall:
        answered_at = time.monotonic()
        last_smoke = time.monotonic()
        while True:
            await asyncio.sleep(self._poll)
            now = time.monotonic()
            try:
                sample = await fetch_load(self._session, self._engine_url, within=self.stall_seconds)
            except MetricsUnavailable as exc:
                if time.monotonic() - answered_at >= self.stall_seconds:
                    return Stall(
                        f"engine stopped answering /metrics for {self.stall_seconds:g}s: {exc}",
                        {"error": str(exc)},
                    )
                continue
            answered_at = time.monotonic()
            self.last_sample = sample
            stall = self.detector.observe(sample)
            if stall is not None:
                return stall
            if self.detector.idle(sample) and now - last_smoke >= self.stall_seconds:
                last_smoke = time.monotonic()
                stall = await self._idle_smoke()
                if stall is not None:
                    return stall

    async def _idle_smoke(self) -> Stall | None:
        started = time.monotonic()
        try:
            await self._readiness.smoke(self._session, self._model, within=self.stall_seconds)
            self.smokes += 1
        except NotReady as exc:
            return Stall(
                f"idle smoke request failed: {exc}",
                {"smoke_seconds": round(time.monotonic() - started, 3), "error": str(exc)},
            )
        return None
