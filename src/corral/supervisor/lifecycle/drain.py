"""The one drain sequence — readiness withdrawn (READY → DRAINING), leave routing, policy, then stop the
engine or hand it over — that shutdown, prestop (`/v1/drain`) and every runbook operation run.

Order: (1) wait until routing has left: every router
subscribed to the state stream has acknowledged the removal epoch, and no request has arrived at the
engine for a quiet period (traffic from outside Corral has no one to acknowledge), both bounded by the
propagation timeout; (2) policy
`wait` lets in-flight requests finish (bounded by the drain timeout), `abort` does not wait; (3)
SIGTERM to the engine's process group, SIGKILL only after the shutdown timeout. The operations stop
after (2) and hand the engine over (`leave` + `apply_policy`); shutdown runs all three (`drain_and_stop`).
`DrainSequence` makes every state transition on the supervisor's state machine itself; `Drainer` only
measures and returns what it saw.

With an admission gate, `wait` also waits for the responses the gate is still relaying: the engine's
running + waiting count drops to 0 while an answer is still on its way to the client (vLLM's API server
renders and tokenizes a prompt before its engine core counts it, and streams the last output after the
engine core has finished), and SIGTERM then would cut it.

Without an admission gate in front of the engine, the only evidence is the engine's own metrics:
arrivals are the increase of running + waiting + finished, and requests cut short are known by count,
not by request id, nor whether tokens had been sent (`forced_exits` is null, with the reason). With a
gate, the report lists the requests the stop cut or aborted (see `forced_exits`).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import aiohttp

from corral.engine.load_sample import LoadSample, MetricsUnavailable, fetch_load
from corral.supervisor.lifecycle.drain_transfers import TransferSide, skipped, wait_transfers
from corral.supervisor.lifecycle.forced_exits import RequestWatch, name_forced_exits
from corral.supervisor.lifecycle.routers import RouterSubscriptions
from corral.supervisor.lifecycle.states import DrainPhase, EngineState, StateMachine, StoppingPhase


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
    # a disaggregated engine's role and lease (None: aggregated, no transfers to wait for)
    transfers: TransferSide | None = None
    # seconds to wait for transfers no engine figure shows (--drain-transfer-wait; 0: rely on the acks)
    transfer_wait: float = 0.0


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
    # responses the admission gate was still relaying when the in-flight wait ended (None: no gate)
    gate_open_at_end: int | None = None
    drain_seconds: float = 0.0
    at_stop: dict[str, float] | None = None
    engine_exit_code: int | None = None
    engine_killed: bool = False
    stop_seconds: float = 0.0
    cut_short: str | None = None
    # the requests the stop cut or aborted, seen by the admission gate; None when there is no gate
    forced_exits: list[dict[str, Any]] | None = None
    forced_exits_not_listed: int = 0  # beyond FORCED_EXITS_LISTED
    forced_exits_unobserved: str | None = None  # why `forced_exits` is None
    # a disaggregated engine's KV transfers (drain_transfers.TransferReport); None when aggregated
    transfers: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


EngineStopper = Callable[[float], Awaitable[int | None]]
Log = Callable[[str], None]


class Drainer:
    """Measures the three steps against one engine and writes what it saw into a `DrainReport`."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        engine_url: str,
        settings: DrainSettings,
        log: Log,
        routers: RouterSubscriptions | None = None,
        gate: RequestWatch | None = None,
    ) -> None:
        self._session = session
        self._gate = gate
        self._engine_url = engine_url
        self.settings = settings
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

    def _open_at_gate(self) -> int | None:
        return len(self._gate.open()) if self._gate is not None else None

    async def wait_in_flight(self, report: DrainReport) -> None:
        """In-flight requests finish: the engine's running + waiting at 0 and, with a gate, no response
        the gate is still relaying (an answer the engine no longer counts, or not yet)."""
        s = self.settings
        started = time.monotonic()
        deadline = started + s.drain_timeout
        next_log = started + 5.0
        while time.monotonic() < deadline:
            sample = await self._sample()
            if sample is None:
                report.notes.append("engine stopped answering /metrics while draining")
                break
            report.gate_open_at_end = self._open_at_gate()
            if sample.in_flight <= 0 and not report.gate_open_at_end:
                report.in_flight_drained = True
                break
            if time.monotonic() >= next_log:
                gate = (
                    "" if report.gate_open_at_end is None else f", {report.gate_open_at_end} open at the gate"
                )
                self._log(
                    f"drain: {sample.running:.0f} running, {sample.waiting:.0f} waiting{gate} "
                    f"({time.monotonic() - started:.0f}s/{s.drain_timeout:g}s)"
                )
                next_log += 5.0
            await asyncio.sleep(s.poll_seconds)
        report.drain_seconds = time.monotonic() - started
        if report.gate_open_at_end and not report.in_flight_drained:
            self._log(
                f"drain: {report.gate_open_at_end} responses still open at the admission gate at the "
                f"drain deadline ({s.drain_timeout:g}s); the stop cuts them (forced_exits names them)"
            )

    async def sample_at_stop(self, report: DrainReport) -> LoadSample | None:
        """The engine's load just before SIGTERM, kept in the report."""
        sample = await self._sample()
        if sample is not None:
            report.at_stop = sample.to_json()
        return sample

    async def stop_engine(
        self, report: DrainReport, stop: EngineStopper, sample: LoadSample | None, gated: bool = False
    ) -> None:
        """Step 3: `stop` (SIGTERM, SIGKILL after the shutdown timeout); what was cut short, from `sample`
        (`gated`: an admission gate names the requests in the report's `forced_exits`)."""
        s = self.settings
        started = time.monotonic()
        code = await stop(s.shutdown_timeout)
        report.stop_seconds = time.monotonic() - started
        report.engine_exit_code = code
        report.engine_killed = code == -signal.SIGKILL
        report.cut_short = self._cut_short(report, sample, gated)
        if report.cut_short:
            self._log(f"drain: {report.cut_short}")

    def _cut_short(self, report: DrainReport, sample: LoadSample | None, gated: bool) -> str | None:
        if sample is None:
            if gated:
                return "engine metrics unavailable at stop: the admission gate names the cut (forced_exits)"
            return (
                "engine metrics unavailable at stop: requests cut short unknown "
                "(no admission gate, so no request ids)"
            )
        if sample.in_flight <= 0:
            return None
        counts = f"{sample.running:.0f} running and {sample.waiting:.0f} waiting requests at SIGTERM"
        unknown = (
            "counts from engine metrics; the admission gate names the requests cut (forced_exits)"
            if gated
            else "counts from engine metrics: without an admission gate neither the request ids nor "
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


S = EngineState


class DrainHost(Protocol):
    """What the sequence needs of the supervisor: its state machine, its engine, its READY watch."""

    routers: RouterSubscriptions

    @property
    def machine(self) -> StateMachine: ...

    @property
    def session(self) -> aiohttp.ClientSession: ...

    @property
    def engine_url(self) -> str: ...

    @property
    def drain_settings(self) -> DrainSettings: ...

    @property
    def engine_running(self) -> bool: ...

    @property
    def request_watch(self) -> RequestWatch | None: ...

    async def suspend_lifecycle(self) -> None: ...

    async def stop_engine(self, grace: float, reason: str) -> int | None: ...


@dataclass
class Leaving:
    """The outcome of leaving routing: what the policy step and the operation's evidence go on."""

    drainer: Drainer
    report: DrainReport

    def evidence(self) -> dict[str, Any]:
        r = self.report
        return {
            "removal_epoch": r.removal_epoch,
            "quiet_reached": r.quiet_reached,
            "arrivals_while_leaving": r.arrivals_while_leaving,
            "routers_acknowledged": [a["router_id"] for a in r.routers_acknowledged],
            "routers_missing": r.routers_missing,
            "routers_gone": r.routers_gone,
            "seconds": round(r.propagation_seconds, 3),
        }


class DrainSequence:
    """The one drain: each step makes its own transition on the host's state machine."""

    def __init__(self, host: DrainHost, log: Log) -> None:
        self._host = host
        self._log = log

    def _transition(self, state: EngineState, reason: str, sub_state: str, **evidence: Any) -> int:
        return self._host.machine.transition(state, reason, sub_state, evidence).epoch

    async def _withdraw(self, reason: str, policy: str) -> int:
        """READY → DRAINING (readiness withdrawn), and the READY watch stopped; the removal epoch."""
        epoch = self._transition(
            S.DRAINING,
            reason,
            DrainPhase.LEAVING_ROUTING,
            policy=policy,
            routers=self._host.routers.subscribed(),
        )
        await self._host.suspend_lifecycle()
        return epoch

    async def _leave_routing(self, report: DrainReport, removal_epoch: int) -> Leaving:
        host = self._host
        drainer = Drainer(
            host.session, host.engine_url, host.drain_settings, self._log, host.routers, host.request_watch
        )
        await drainer.leave_routing(report, removal_epoch)
        return Leaving(drainer, report)

    async def leave(self, reason: str, policy: str) -> Leaving:
        """Steps up to (1) for an operation: withdraw readiness, then wait for acks and a quiet period."""
        removal_epoch = await self._withdraw(reason, policy)
        return await self._leave_routing(DrainReport(policy=policy), removal_epoch)

    async def apply_policy(self, leaving: Leaving, policy: str) -> dict[str, Any]:
        """Step (2): `wait` for in-flight requests (`leaving.report.in_flight_drained` says whether they
        finished), `abort` or `keep` them; the step's evidence."""
        report = leaving.report
        left = leaving.evidence()
        if policy == DrainPolicy.WAIT:
            timeout = self._host.drain_settings.drain_timeout
            self._transition(
                S.DRAINING,
                f"waiting for in-flight requests (up to {timeout:g}s)",
                DrainPhase.WAITING_IN_FLIGHT,
                **left,
            )
            deadline = time.monotonic() + timeout
            await leaving.drainer.wait_in_flight(report)
            await self._wait_transfers(report, deadline)
            return {
                "policy": "wait",
                "in_flight_drained": report.in_flight_drained,
                **({"gate_open": report.gate_open_at_end} if report.gate_open_at_end is not None else {}),
                "seconds": round(report.drain_seconds, 3),
                **({"transfers": report.transfers} if report.transfers is not None else {}),
            }
        side = self._host.drain_settings.transfers
        if side is not None:
            report.transfers = skipped(side, f"policy {policy}").to_json()
        sample = leaving.drainer.last_sample
        in_flight = sample.in_flight if sample is not None else None
        if policy == DrainPolicy.ABORT:
            self._transition(
                S.DRAINING, "policy abort: in-flight requests will be cut", DrainPhase.ABORTING, **left
            )
            return {"policy": "abort", "in_flight_at_abort": in_flight}
        return {
            "policy": "keep",
            "in_flight_frozen": in_flight,
            "note": "frozen requests resume after the wake",
        }

    async def _wait_transfers(self, report: DrainReport, deadline: float) -> None:
        """A disaggregated engine's transfers after its requests: held ones pulled or expired, pulls
        finished (drain_transfers.py), within what is left of the drain's deadline."""
        host = self._host
        settings = host.drain_settings
        side = settings.transfers
        if side is None:
            return
        self._transition(
            S.DRAINING,
            f"waiting for the {side.role} engine's KV transfers (lease {side.lease_seconds:g}s)",
            DrainPhase.WAITING_TRANSFERS,
        )
        seen = await wait_transfers(
            host.session,
            host.engine_url,
            side,
            deadline,
            settings.transfer_wait,
            settings.poll_seconds,
            self._log,
        )
        seen.routers_unconfirmed = sum(
            int(a.get("transfers_unconfirmed") or 0) for a in report.routers_acknowledged
        )
        report.transfers = seen.to_json()

    async def drain_and_stop(self, policy: DrainPolicy) -> DrainReport:
        """Shutdown and prestop: all three steps, then STOPPING/engine_stopped with the report."""
        host = self._host
        settings = host.drain_settings
        report = DrainReport(policy=policy.value)
        state_before, sub_before = host.machine.state, host.machine.sub_state
        watch = host.request_watch
        mark = watch.mark() if watch is not None else 0  # forced exits from here on are the drain's
        removal_epoch: int | None = None
        if state_before is S.READY:
            removal_epoch = await self._withdraw("drain: readiness withdrawn", policy.value)
        else:
            await host.suspend_lifecycle()
        if removal_epoch is not None and host.engine_running:
            leaving = await self._leave_routing(report, removal_epoch)
            await self.apply_policy(leaving, policy.value)
            sample = await leaving.drainer.sample_at_stop(report)
            self._transition(
                S.STOPPING,
                f"SIGTERM to the engine, SIGKILL after {settings.shutdown_timeout:g}s",
                StoppingPhase.STOPPING_ENGINE,
                at_stop=report.at_stop,
            )
            await leaving.drainer.stop_engine(report, self._stop_for_drain, sample, gated=watch is not None)
        else:
            where, why = f"drain in {state_before}", "nothing was routed here"
            if sub_before == DrainPhase.NOT_ANSWERING:  # withdrawn: routers left it, and it answers nothing
                where, why = f"{where}/{sub_before}", "routers had left; the engine answers nothing"
            report.notes.append(f"{where}: {why}")
            self._transition(
                S.STOPPING,
                f"{where}: no traffic to drain, stopping the engine",
                StoppingPhase.STOPPING_ENGINE,
            )
            report.engine_exit_code = await host.stop_engine(settings.shutdown_timeout, "drain")
        named = await name_forced_exits(watch, mark, self._log)
        report.forced_exits, report.forced_exits_not_listed, report.forced_exits_unobserved = named
        self._transition(
            S.STOPPING,
            "engine stopped" + (f"; {report.cut_short}" if report.cut_short else ""),
            StoppingPhase.ENGINE_STOPPED,
            **report.to_json(),
        )
        return report

    async def _stop_for_drain(self, grace: float) -> int | None:
        return await self._host.stop_engine(grace, "drain")
