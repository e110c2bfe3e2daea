"""READY ⇄ DRAINING/not_answering: a READY engine whose `/health` stops answering (checks/answering.py)
is withdrawn from routing within seconds, and comes back only by earning readiness again.

- Withdrawn: READY → DRAINING/`not_answering`, with the probes as evidence. `/readyz` answers 503 at
  once, the admission gate refuses new requests, and every router reads the state line as a removal
  and acknowledges it (the same path as a drain's `leaving_routing`). Nothing is stopped.
- Back: once `/health` answers 200 again, the whole earned-readiness check runs (`/health`, the model
  listed, a smoke completion); it passing is DRAINING → READY, and routers bring the engine back on
  their slow-start ramp. A check that fails keeps the engine out and is retried a period later.
- Failing and restarting the engine stays with the stall rule, which keeps running through the
  withdrawal (`EngineSupervisor._serve`): an engine silent for `--stall-seconds` is FAILED, then
  restarted in place.

Runs as one task of `_serve`, beside the stall, exit and rank watches, and never returns; it acts only
from the state it left the engine in (READY, or its own withdrawal), so an operation or a drain that
moves the engine meanwhile is never undone here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

import aiohttp

from corral.supervisor.checks.answering import AnswerRule, HealthProbe, Unanswered, probe_health
from corral.supervisor.checks.readiness import NotReady, ReadinessCheck
from corral.supervisor.lifecycle.states import DrainPhase, EngineState, StateMachine

S = EngineState
Log = Callable[[str], None]


class AnsweringHost(Protocol):
    """What the watch needs of the supervisor."""

    @property
    def machine(self) -> StateMachine: ...

    @property
    def session(self) -> aiohttp.ClientSession: ...

    @property
    def engine_url(self) -> str: ...

    readiness: ReadinessCheck

    def note_not_answering(self, withdrawn: bool) -> None: ...


class NotAnswering:
    """One READY period's watch of whether the engine answers; `run` withdraws and restores it."""

    def __init__(self, host: AnsweringHost, limit: float, log: Log) -> None:
        self._host = host
        self.limit = limit
        self._log = log
        self.rule = AnswerRule(limit, time.monotonic())
        self.withdrawn_at: float | None = None  # time.monotonic() of the withdrawal, while out

    def _in(self, state: EngineState, sub_state: str | None) -> bool:
        machine = self._host.machine
        return machine.state is state and machine.sub_state == sub_state

    async def run(self) -> NoReturn:
        while True:
            unanswered = await self._until_unanswered()
            if not self._in(S.READY, None):
                self.rule = AnswerRule(self.limit, time.monotonic())  # not ours to withdraw now
                continue
            self._withdraw(unanswered)
            await self._until_earned()

    async def _probe(self) -> HealthProbe:
        rule = self.rule
        within = rule.timeout_for(time.monotonic())
        probe = await probe_health(self._host.session, self._host.engine_url, within)
        await asyncio.sleep(max(0.0, probe.at + rule.period - time.monotonic()))
        return probe

    async def _until_unanswered(self) -> Unanswered:
        while True:
            verdict = self.rule.observe(await self._probe())
            if verdict is not None:
                return verdict

    def _withdraw(self, unanswered: Unanswered) -> None:
        self.withdrawn_at = time.monotonic()
        self._log(unanswered.reason)
        self._host.note_not_answering(True)
        self._host.machine.transition(
            S.DRAINING, unanswered.reason, DrainPhase.NOT_ANSWERING, unanswered.evidence
        )

    async def _until_earned(self) -> None:
        """Out of routing until `/health` answers and the whole readiness check passes, then READY."""
        last_problem: str | None = None
        while self._in(S.DRAINING, DrainPhase.NOT_ANSWERING):
            probe = await self._probe()
            if not probe.answered or not self._in(S.DRAINING, DrainPhase.NOT_ANSWERING):
                continue
            try:
                smoke = await self._host.readiness.earn(self._host.session)
            except NotReady as exc:
                if str(exc) != last_problem:
                    last_problem = str(exc)
                    self._log(f"engine answers /health again but is not ready yet: {exc}")
                continue
            if not self._in(S.DRAINING, DrainPhase.NOT_ANSWERING):
                return
            out_for = time.monotonic() - (self.withdrawn_at or time.monotonic())
            evidence: dict[str, Any] = {"withdrawn_seconds": round(out_for, 3), **smoke.to_json()}
            reason = (
                f"answering again after {out_for:.1f}s out of routing: health 200, model listed, "
                "smoke completion answered"
            )
            self._log(reason)
            self._host.note_not_answering(False)
            self._host.machine.transition(S.READY, reason, None, evidence)
            self.withdrawn_at = None
            self.rule = AnswerRule(self.limit, time.monotonic())
            return
