"""Dependency gates: what must be up before the engine may start (`--wait-for unix:/path`,
`tcp:host:port`, `http(s)://…` answering 2xx, `file:/path`; the syntax is `corral.gate_spec`'s), and the
wait for all of them with one deadline, capped backoff, progress lines and the last error of every gate
kept for `/startupz`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from corral.gate_spec import GateSpec, parse_gate_spec


class GateClosed(Exception):
    """The dependency is not there yet; the message says what was seen."""


@dataclass(frozen=True)
class DependencyGate(GateSpec):
    """One declared dependency; `probe` returns when it is up and raises GateClosed when not."""

    async def probe(self, session: aiohttp.ClientSession, within: float = 2.0) -> None:
        try:
            if self.kind == "unix":
                await self._connect(asyncio.open_unix_connection(self.target), within)
            elif self.kind == "tcp":
                await self._connect(asyncio.open_connection(self.target, self.port), within)
            elif self.kind == "file":
                if not Path(self.target).exists():  # noqa: ASYNC240  (one stat, no I/O wait)
                    raise GateClosed(f"{self.target} does not exist")
            else:
                await self._http(session, within)
        except GateClosed:
            raise
        except TimeoutError as exc:
            raise GateClosed(f"no answer within {within:.0f}s") from exc
        except (OSError, aiohttp.ClientError) as exc:
            raise GateClosed(_describe(exc)) from exc

    @staticmethod
    async def _connect(opening: Any, within: float) -> None:
        _, writer = await asyncio.wait_for(opening, within)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    async def _http(self, session: aiohttp.ClientSession, within: float) -> None:
        async with session.get(self.target, timeout=aiohttp.ClientTimeout(total=within)) as resp:
            if not 200 <= resp.status < 300:
                raise GateClosed(f"answered HTTP {resp.status}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def parse_gate(spec: str) -> DependencyGate:
    """The gate a `--wait-for` value names; a GateSpecError when it names none (`corral.gate_spec`)."""
    parsed = parse_gate_spec(spec)
    return DependencyGate(parsed.spec, parsed.kind, parsed.target, parsed.port)


@dataclass
class GateStatus:
    """What `/startupz` shows for one gate."""

    spec: str
    open: bool = False
    attempts: int = 0
    waited_seconds: float = 0.0
    last_error: str | None = None
    started_at: float = field(default_factory=time.monotonic)

    def to_json(self) -> dict[str, Any]:
        return {
            "gate": self.spec,
            "open": self.open,
            "attempts": self.attempts,
            "waited_seconds": round(self.waited_seconds, 3),
            "last_error": self.last_error,
        }


class GatesTimedOut(Exception):
    """The deadline passed with gates still closed; the message names each with its last error."""

    def __init__(self, closed: Sequence[GateStatus], deadline: float) -> None:
        names = "; ".join(f"{g.spec} ({g.last_error or 'never probed'})" for g in closed)
        super().__init__(f"dependency not available after {deadline:.0f}s: {names}")
        self.closed = list(closed)


ProgressLog = Callable[[str], None]


class GateWaiter:
    """Waits for every gate at once until all are open or the deadline passes."""

    def __init__(
        self,
        gates: Sequence[DependencyGate],
        deadline_seconds: float,
        log: ProgressLog,
        initial_backoff: float = 0.1,
        max_backoff: float = 2.0,
        progress_every: float = 5.0,
    ) -> None:
        self.gates = list(gates)
        self.deadline_seconds = deadline_seconds
        self.status = {g.spec: GateStatus(g.spec) for g in self.gates}
        self._log = log
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._progress_every = progress_every

    def to_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.status.values()]

    async def wait(self, session: aiohttp.ClientSession) -> None:
        """Returns when every gate is open; raises GatesTimedOut when the deadline passes first."""
        started = time.monotonic()
        for status in self.status.values():
            status.open = False
            status.started_at = started
        deadline = started + self.deadline_seconds
        await asyncio.gather(*(self._wait_one(session, g, deadline) for g in self.gates))
        closed = [s for s in self.status.values() if not s.open]
        if closed:
            raise GatesTimedOut(closed, self.deadline_seconds)

    async def _wait_one(self, session: aiohttp.ClientSession, gate: DependencyGate, deadline: float) -> None:
        status = self.status[gate.spec]
        backoff = self._initial_backoff
        next_progress = status.started_at + self._progress_every
        while True:
            now = time.monotonic()
            status.attempts += 1
            try:
                await gate.probe(session, within=max(0.1, min(2.0, deadline - now)))
            except GateClosed as exc:
                status.last_error = str(exc)
            else:
                status.open = True
                status.waited_seconds = time.monotonic() - status.started_at
                status.last_error = None
                self._log(f"dependency {gate.spec} is up after {status.waited_seconds:.1f}s")
                return
            now = time.monotonic()
            status.waited_seconds = now - status.started_at
            if now >= deadline:
                self._log(f"dependency {gate.spec} still down at the deadline: {status.last_error}")
                return
            if now >= next_progress:
                self._log(
                    f"waiting for {gate.spec}: {status.waited_seconds:.0f}s/{self.deadline_seconds:.0f}s, "
                    f"last error: {status.last_error}"
                )
                next_progress = now + self._progress_every
            await asyncio.sleep(min(backoff, max(0.0, deadline - now)))
            backoff = min(backoff * 2, self._max_backoff)
