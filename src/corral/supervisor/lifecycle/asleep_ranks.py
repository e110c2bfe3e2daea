"""The rank watch of a SLEEPING engine that no operation holds: the one state in which nothing else
watches it (the lifecycle watches STARTING and READY, a runbook operation its own steps).

A rank lost while the engine sleeps (its process gone while the engine runs, or a line naming a rank
or collective failure), or the engine exiting in its sleep, fails the engine at once: FAILED with the
rank named and the rank watch's evidence, then a restart in place (weights from disk: a known state).
The seed's rule: a group with a rank that cannot come back leaves routing and restarts; it is not left
asleep until a wake finds it dead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from corral.supervisor.lifecycle.states import EngineState

if TYPE_CHECKING:
    from corral.supervisor.lifecycle.engine_process import EngineProcess
    from corral.supervisor.lifecycle.sleep_status import SleepStatus
    from corral.supervisor.lifecycle.states import StateMachine

S = EngineState
POLL_SECONDS = 0.5  # as the READY rank watch polls the process table


class AsleepHost(Protocol):
    """What the watch reads of the supervisor, and the one thing it asks of it."""

    @property
    def engine(self) -> EngineProcess | None: ...
    @property
    def machine(self) -> StateMachine: ...
    @property
    def busy(self) -> str | None: ...
    @property
    def sleep_status(self) -> SleepStatus | None: ...
    async def fail_asleep(self, reason: str, evidence: dict[str, Any]) -> None: ...


def asleep_failure(engine: EngineProcess, sleep: dict[str, Any] | None) -> tuple[str, dict[str, Any]] | None:
    """Why a sleeping engine can no longer wake (a rank lost, or the engine gone) with the evidence;
    None while its ranks are whole and it runs."""
    loss = engine.ranks.final_loss() if engine.running else engine.ranks.loss
    if loss is not None:
        reason = f"{loss.reason} (while SLEEPING)"
        return reason, {**loss.evidence, "exit_code": engine.returncode, "sleep": sleep}
    if not engine.running:
        reason = f"engine exited with code {engine.returncode} while SLEEPING"
        return reason, {
            "exit_code": engine.returncode,
            "last_lines": list(engine.last_lines()),
            "sleep": sleep,
        }
    return None


class AsleepRankWatch:
    """Runs for the supervisor's life; acts only on a SLEEPING engine no operation holds."""

    def __init__(
        self, host: AsleepHost, log: Callable[[str], None], poll_seconds: float = POLL_SECONDS
    ) -> None:
        self._host = host
        self._log = log
        self.poll_seconds = poll_seconds

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            host = self._host
            engine = host.engine
            if engine is None or host.machine.state is not S.SLEEPING or host.busy is not None:
                continue
            status = host.sleep_status
            failure = asleep_failure(engine, status.to_json() if status is not None else None)
            if failure is None:
                continue
            reason, evidence = failure
            self._log(f"sleeping engine failed: {reason}")
            await host.fail_asleep(reason, evidence)
