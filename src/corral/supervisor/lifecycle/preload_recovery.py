"""What the supervisor does when the preload daemon dies under its engine, and why.

The engine leaves routing at once: READY → FAILED with a reason that names the daemon's death (the
routers' state streams drop it on that event, the admission gate answers 503). The engine is stopped,
the daemon is started again — bounded restarts with capped exponential backoff, each one either
healthy within the dependency deadline or stopped and tried again — and the engine starts afresh
from the new daemon through the normal startup path (dependency gates, load, health, model list,
smoke, adapters) before it is READY again. A daemon that keeps dying spends its restarts and the
engine is FAILED for good with that reason; a daemon death also spends one of the engine's failure
restarts, so a daemon that dies after every recovery cannot cycle forever either.

Why restart the engine instead of re-verifying the one still running: with `zero_copy` its weights
are memory the dead daemon owned (CUDA IPC handles lose their meaning once the exporting process is
gone), and nothing on vLLM's HTTP surface proves that the tensors still hold what was loaded —
`/health` says the process lives and a smoke completion says it produces tokens, not that the tokens
come from the right weights. The only evidence an SRE can trust is a load the supervisor watched: a
new engine taking its weights from the new daemon, where a disk fallback is recorded as evidence and
counted. The cost is one engine start from a warm cache; the alternative risks wrong answers served
as right ones. The rule is the same in `copy` mode (the supervisor does not second-guess the loader
configuration it passes through), where it costs one avoidable restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp

from corral.engine.evidence import PRELOAD_EXIT, EvidenceBook
from corral.supervisor.lifecycle.config import SupervisorConfig
from corral.supervisor.lifecycle.engine_process import RestartPolicy
from corral.supervisor.lifecycle.metrics import SupervisorMetrics
from corral.supervisor.lifecycle.preload import PreloadDaemon, Record


class PreloadKeeper:
    """The supervisor's side of its daemon: records a death the moment it happens (operation log,
    evidence, metric), says whether the daemon is lost, and revives it."""

    def __init__(
        self,
        daemon: PreloadDaemon,
        config: SupervisorConfig,
        metrics: SupervisorMetrics,
        evidence: EvidenceBook,
        record: Record,
        log: Callable[[str], None],
        state: Callable[[], str],
    ) -> None:
        self.daemon = daemon
        self._config = config
        self._metrics = metrics
        self._evidence = evidence
        self._record = record
        self._log = log
        self._state = state
        daemon.on_death = self._died
        daemon.on_rank_lost = self._rank_lost

    async def start(self) -> None:
        await self.daemon.start(self._record)

    def _rank_lost(self, daemon: PreloadDaemon, reason: str) -> None:
        """A rank died under a running parent: named now; the parent is stopped next, and its exit
        is handled as the daemon's death (`_died`), whose reason then starts with this one."""
        self._log(f"{reason} while {self._state()}; stopping the daemon (pid {daemon.pid})")
        self._evidence.note(PRELOAD_EXIT, reason)
        self._record(
            "preload_rank_lost",
            pid=daemon.pid,
            reason=reason,
            ranks=daemon.ranks.to_json(),
            state=self._state(),
            last_lines=daemon.last_lines(),
        )

    def _died(self, daemon: PreloadDaemon) -> None:
        what = f"preload daemon pid {daemon.pid} exited with code {daemon.returncode}"
        if daemon.ranks.lost is not None:
            what = f"{daemon.ranks.lost}; {what} (stopped by the supervisor)"
        self._log(f"{what} while {self._state()}")
        self._evidence.note(PRELOAD_EXIT, what)
        self._metrics.preload_exits.inc()
        self._record(
            "preload_exited",
            pid=daemon.pid,
            exit_code=daemon.returncode,
            state=self._state(),
            last_lines=daemon.last_lines(),
        )

    @property
    def lost(self) -> str | None:
        """Why the daemon is gone, while it is (it died and has not been started again)."""
        if not self.daemon.lost:
            return None
        if self.daemon.ranks.lost is not None:
            return f"{self.daemon.ranks.lost}; the daemon (pid {self.daemon.pid}) was stopped"
        return f"preload daemon (pid {self.daemon.pid}) exited with code {self.daemon.returncode}"

    def death_task(self) -> asyncio.Task[Any]:
        """Done once the daemon dies (at once if it is dead): for the lifecycle's races."""
        return asyncio.create_task(self.daemon.died.wait(), name="preload-death")

    async def revive(self, session: aiohttp.ClientSession) -> str | None:
        """Start the dead daemon again until its health answers 200: None then, or why it was given up."""
        policy = RestartPolicy(
            self._config.preload_restarts, self._config.restart_backoff, self._config.restart_backoff_cap
        )
        grace = min(5.0, self._config.drain.shutdown_timeout)
        daemon = self.daemon
        last = f"exited with code {daemon.returncode}"
        while True:
            backoff = policy.next_backoff()
            if backoff is None:
                return f"preload daemon keeps dying: {policy.budget} restarts spent (last: {last})"
            self._metrics.preload_restarts.inc()
            self._log(f"preload daemon restart {policy.used} in {backoff:g}s (after: {last})")
            self._record("preload_restart", attempt=policy.used, backoff_seconds=backoff, after=last)
            await asyncio.sleep(backoff)
            try:
                await daemon.start(self._record)
            except OSError as exc:
                last = f"cannot start {daemon.argv[0]}: {exc}"
                continue
            problem = await daemon.wait_healthy(session, self._config.dependency_timeout)
            if problem is None:
                self._record("preload_healthy", pid=daemon.pid, attempt=policy.used)
                self._log(f"preload daemon healthy again (pid {daemon.pid})")
                return None
            last = problem
            await daemon.stop(grace, self._record)
