"""The drain: leave routing, apply the policy to in-flight requests, then stop the engine.

Order (readiness is already false when this starts): (1) wait until routing has left: every router
subscribed to the state stream has acknowledged the removal epoch, and no request has arrived at the
engine for a quiet period (traffic from outside Corral has no one to acknowledge), both bounded by the
propagation timeout; (2) policy
`wait` lets in-flight requests finish (bounded by the drain timeout), `abort` does not wait; (3)
SIGTERM to the engine's process group, SIGKILL only after the shutdown timeout.

Without an admission gate in front of the engine, the only evidence is the engine's own metrics:
arrivals are the increase of running + waiting + finished, and requests cut short are known by count,
not by request id, nor whether tokens had been sent.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import aiohttp

from corral.engine.load_sample import LoadSample, MetricsUnavailable, fetch_load
from corral.supervisor.lifecycle.routers import RouterSubscriptions


class DrainPolicy(StrEnum):
    WAIT = "wait"
    ABORT = "abort"


class QuietPeriod:
    """Says when no request has reached the engine for `quiet_seconds` (the pure rule of step 1)."""

    def __init__(self, quiet_seconds: float) -> None:
        self.quiet_seconds = quiet_seconds
        self.arrivals = 0.0
        self._admitted: float | None = None
        self._last_change: float | None = None

    def observe(self, sample: LoadSample) -> bool:
        """Feed one sample; True once the quiet period has been observed in full."""
        if self._admitted is None or self._last_change is None:
            self._admitted = sample.admitted
            self._last_change = sample.at
            return False
        if sample.admitted > self._admitted:
            self.arrivals += sample.admitted - self._admitted
            self._last_change = sample.at
        self._admitted = sample.admitted
        return sample.at - self._last_change >= self.quiet_seconds


@dataclass(frozen=True)
class DrainSettings:
    policy: DrainPolicy = DrainPolicy.WAIT
    propagation_timeout: float = 10.0
    quiet_period: float = 1.0
    drain_timeout: float = 120.0
    shutdown_timeout: float = 30.0
    poll_seconds: float = 0.1


@dataclass
class DrainReport:
    """What happened, for the operation log and the operation's answer."""

    policy: str
    removal_epoch: int | None = None
    routers_acknowledged: list[dict[str, Any]] = field(default_factory=list)
    routers_missing: list[str] = field(default_factory=list)
    routers_gone: list[str] = field(default_factory=list)
    acknowledged_after_s: float | None = None
    quiet_reached: bool = False
    propagation_seconds: float = 0.0
    arrivals_while_leaving: float = 0.0
    in_flight_drained: bool = False
    drain_seconds: float = 0.0
    at_stop: dict[str, float] | None = None
    engine_exit_code: int | None = None
    engine_killed: bool = False
    stop_seconds: float = 0.0
    cut_short: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


PhaseCallback = Callable[[str, str, dict[str, Any]], None]
EngineStopper = Callable[[float], Awaitable[int | None]]
Log = Callable[[str], None]


class Drainer:
    """Runs the three steps against one engine; `phase(sub_state, reason, evidence)` reports progress."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        engine_url: str,
        settings: DrainSettings,
        phase: PhaseCallback,
        log: Log,
        routers: RouterSubscriptions | None = None,
    ) -> None:
        self._session = session
        self._engine_url = engine_url
        self.settings = settings
        self._phase = phase
        self._log = log
        self._routers = routers
        self.last_sample: LoadSample | None = None

    async def _sample(self) -> LoadSample | None:
        try:
            self.last_sample = await fetch_load(self._session, self._engine_url, within=2.0)
        except MetricsUnavailable:
            return None
        return self.last_sample

    async def leave_routing(self, report: DrainReport, removal_epoch: int | None = None) -> None:
        """Step 1. With `removal_epoch`, also wait for every subscribed router's acknowledgement of it."""
        s = self.settings
        started = time.monotonic()
        quiet = QuietPeriod(s.quiet_period)
        deadline = started + s.propagation_timeout
        routers = self._routers if removal_epoch is not None else None
        report.removal_epoch = removal_epoch
        if routers is not None and removal_epoch is not None:
            routers.begin_wait(removal_epoch)
            awaited = routers.subscribed()
            self._log(
                f"drain: readiness withdrawn at epoch {removal_epoch}; awaiting acknowledgements from "
                f"{len(awaited)} subscribed routers ({', '.join(awaited) or 'none'}) and "
                f"{s.quiet_period:g}s without a new request (deadline {s.propagation_timeout:g}s)"
            )
        acked = routers is None
        try:
            while True:
                if routers is not None:
                    routers.arm()
                if routers is not None and removal_epoch is not None and not acked:
                    acked = not routers.missing(removal_epoch)
                    if acked:
                        report.acknowledged_after_s = time.monotonic() - started
                        self._log(
                            f"drain: every subscribed router acknowledged epoch {removal_epoch} after "
                            f"{report.acknowledged_after_s:.3f}s"
                        )
                sample = await self._sample()
                if sample is None:
                    report.notes.append("engine stopped answering /metrics while leaving routing")
                    break
                report.quiet_reached = quiet.observe(sample)
                if report.quiet_reached and acked:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if routers is not None:
                    await routers.changed(min(s.poll_seconds, left))
                else:
                    await asyncio.sleep(min(s.poll_seconds, left))
        finally:
            wait = routers.end_wait() if routers is not None else None
        report.propagation_seconds = time.monotonic() - started
        report.arrivals_while_leaving = quiet.arrivals
        if wait is not None:
            report.routers_acknowledged = [a.to_json() for a in wait.acknowledged.values()]
            report.routers_gone = list(wait.gone)
            report.routers_missing = list(wait.missing)
            if wait.missing:
                self._log(
                    f"drain: routers {', '.join(wait.missing)} did not acknowledge epoch {removal_epoch} "
                    f"within {s.propagation_timeout:g}s; going on"
                )
        if report.quiet_reached:
            self._log(
                f"drain: no new request for {s.quiet_period:g}s after {report.propagation_seconds:.1f}s; "
                "routing has left"
            )
        else:
            self._log(
                f"drain: requests still arriving at the propagation deadline ({s.propagation_timeout:g}s, "
                f"{quiet.arrivals:.0f} arrived); going on: a router that still sends here must retry "
                "elsewhere once the engine stops accepting"
            )

    async def wait_in_flight(self, report: DrainReport) -> None:
        s = self.settings
        started = time.monotonic()
        deadline = started + s.drain_timeout
        next_log = started + 5.0
        while time.monotonic() < deadline:
            sample = await self._sample()
            if sample is None:
                report.notes.append("engine stopped answering /metrics while draining")
                break
            if sample.in_flight <= 0:
                report.in_flight_drained = True
                break
            if time.monotonic() >= next_log:
                self._log(
                    f"drain: {sample.running:.0f} running, {sample.waiting:.0f} waiting "
                    f"({time.monotonic() - started:.0f}s/{s.drain_timeout:g}s)"
                )
                next_log += 5.0
            await asyncio.sleep(s.poll_seconds)
        report.drain_seconds = time.monotonic() - started

    async def stop_engine(self, report: DrainReport, stop: EngineStopper, phase_sub_state: str) -> None:
        s = self.settings
        sample = await self._sample()
        if sample is not None:
            report.at_stop = sample.to_json()
        self._phase(
            phase_sub_state,
            f"SIGTERM to the engine, SIGKILL after {s.shutdown_timeout:g}s",
            {"at_stop": report.at_stop},
        )
        started = time.monotonic()
        code = await stop(s.shutdown_timeout)
        report.stop_seconds = time.monotonic() - started
        report.engine_exit_code = code
        report.engine_killed = code == -signal.SIGKILL
        report.cut_short = self._cut_short(report, sample)
        if report.cut_short:
            self._log(f"drain: {report.cut_short}")

    def _cut_short(self, report: DrainReport, sample: LoadSample | None) -> str | None:
        if sample is None:
            return (
                "engine metrics unavailable at stop: requests cut short unknown "
                "(no admission gate, so no request ids)"
            )
        if sample.in_flight <= 0:
            return None
        counts = f"{sample.running:.0f} running and {sample.waiting:.0f} waiting requests at SIGTERM"
        unknown = (
            "counts from engine metrics: without an admission gate neither the request ids nor "
            "whether tokens had been sent are known"
        )
        if report.engine_killed:
            return (
                f"{counts}; the engine did not exit within {self.settings.shutdown_timeout:g}s and was "
                f"SIGKILLed, cutting short whatever of them its own drain had not finished ({unknown})"
            )
        return (
            f"{counts}; the engine exited by itself (code {report.engine_exit_code}) after its own "
            f"drain: any it did not finish were cut short ({unknown})"
        )
