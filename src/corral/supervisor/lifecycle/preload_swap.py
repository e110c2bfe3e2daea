"""A bundle switch moves the preload daemon with its engine: the runbook's rule is that a daemon whose vLLM
version differs from its engine's is replaced, its cache rebuilt, before the engine starts
(`corral supervise --bundle FILE` with `preload_command:`; the host's `--preload-command` otherwise).

The order, when the daemon's command or the vLLM it runs differs from the running one's:

1. the engine stops (a zero-copy engine maps the daemon's memory: it goes before the daemon, and one
   GPU set cannot hold two copies of the weights);
2. the old daemon stops;
3. the new daemon starts and its `/health` answers 200: its ranks loaded the weights from disk under
   the new version;
4. the engine's start follows (not here): PRECHECK of the pair, the load, VERIFY's Mapped line.

A daemon with the same command and version is kept, as on an engine restart: its cache is still valid.
The way back (RECOVER, a rollback) is the same move toward the old bundle's daemon.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from corral.redaction import redact_argv
from corral.supervisor.lifecycle.preload import PreloadDaemon, Record
from corral.supervisor.precheck.preload_pair import daemon_install


@dataclass(frozen=True)
class DaemonRun:
    """One daemon as a change record shows it: its command (secrets masked), vLLM version and pid."""

    argv: tuple[str, ...]
    version: str | None
    pid: int | None

    @classmethod
    def of(cls, daemon: PreloadDaemon) -> DaemonRun:
        return cls(tuple(daemon.argv), daemon.version, daemon.pid if daemon.running else None)

    def to_json(self) -> dict[str, Any]:
        return {"argv": redact_argv(self.argv), "version": self.version, "pid": self.pid}


@dataclass(frozen=True)
class PreloadMove:
    """What a switch did with the daemon: kept it, or replaced it (healthy, or `problem` says why not)."""

    before: DaemonRun
    after: DaemonRun
    replaced: bool
    why: str
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "before": self.before.to_json(),
            "after": self.after.to_json(),
            "replaced": self.replaced,
            "why": self.why,
        }
        if self.problem is not None:
            body["problem"] = self.problem
        return body


def _why_replaced(daemon: PreloadDaemon, argv: Sequence[str], version: str | None) -> str | None:
    """Why the running daemon cannot serve the bundle whose daemon is `argv` on `version`; None: it can."""
    if list(argv) != daemon.argv:
        return "the bundle's daemon command differs"
    if version != daemon.version:
        return f"vLLM {version} installed for the daemon, the running one was started on {daemon.version}"
    if not daemon.running:
        return "the daemon is not running"
    return None


async def move_daemon(
    daemon: PreloadDaemon,
    argv: Sequence[str],
    *,
    stop_engine: Callable[[], Awaitable[object]],
    session: aiohttp.ClientSession,
    within: float,
    grace: float,
    record: Record,
) -> PreloadMove:
    """Keep the running daemon, or replace it with `argv` in the runbook's order (the engine first)."""
    before = DaemonRun.of(daemon)
    version = (await asyncio.to_thread(daemon_install, argv)).version
    why = _why_replaced(daemon, argv, version)
    if why is None:
        record("preload_kept", pid=daemon.pid, version=daemon.version)
        return PreloadMove(before, before, replaced=False, why="same command and vLLM version")
    await stop_engine()
    await daemon.stop(grace, record)
    daemon.retarget(argv)
    problem: str | None
    try:
        await daemon.start(record)
    except OSError as exc:
        problem = f"the preload daemon {argv[0]} cannot start: {exc}"
    else:
        problem = await daemon.wait_healthy(session, within)
    if problem is None:
        record("preload_healthy", pid=daemon.pid, version=daemon.version, cause="bundle_switch")
    else:
        await daemon.stop(grace, record)
    return PreloadMove(before, DaemonRun.of(daemon), replaced=True, why=why, problem=problem)
