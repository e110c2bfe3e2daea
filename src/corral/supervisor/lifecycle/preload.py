"""The preload daemon as the supervisor's second child (`corral supervise --preload-command CMD
--preload-health URL`): it starts first, the engine only once its health answers 200 (a dependency
gate, checked again before every engine restart, so a restart reuses the running daemon), and at
shutdown it stops only after the engine, whose weights may be mapped from its memory.

A death the supervisor did not ask for is reported the moment it happens (`on_death`, then the
`died` event); what follows it is `corral.supervisor.lifecycle.preload_recovery`'s. Its ranks are
watched (`preload_ranks`): a rank process that dies leaves vLLM's parent running with `/health` 503,
so the supervisor names the rank (`on_rank_lost`), stops the parent and treats it as the daemon's
death. A bundle switch may run another daemon in its place (`retarget`, then `start`:
`corral.supervisor.lifecycle.preload_swap`); each run keeps the vLLM version it was started on. A disk
fallback of the engine's weight load is recorded as `engine_evidence` (kind `fallback`, see
`corral.engine.evidence`) and counted in `/v1/state` and `/metrics`; it is never silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from corral.child_process import ChildProcess, LineSink
from corral.supervisor.lifecycle.engine_process import engine_environment
from corral.supervisor.lifecycle.preload_ranks import DaemonRanks, expected_ranks
from corral.supervisor.precheck.preload_pair import daemon_install

Record = Callable[..., Any]
DeathListener = Callable[["PreloadDaemon"], None]
RankListener = Callable[["PreloadDaemon", str], None]


class PreloadDaemon:
    def __init__(self, argv: Sequence[str], health_url: str, echo: LineSink) -> None:
        self.argv = list(argv)
        self.health_url = health_url
        self._echo = echo
        self._child = ChildProcess("preload", self.argv, sink=echo)
        self._watch: asyncio.Task[None] | None = None
        self._rank_watch: asyncio.Task[None] | None = None
        self._stopping = False
        self.ranks = DaemonRanks(expected_ranks(self.argv))
        self.on_death: DeathListener | None = None
        self.on_rank_lost: RankListener | None = None
        self.died = asyncio.Event()  # set once this run exits without the supervisor stopping it
        self.starts = 0
        self.version: str | None = None  # the vLLM this run was started on (None: not stated)

    @property
    def pid(self) -> int | None:
        return self._child.pid

    @property
    def running(self) -> bool:
        return self._child.running

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    @property
    def lost(self) -> bool:
        """Started, then gone without the supervisor stopping it."""
        return self.died.is_set()

    def retarget(self, argv: Sequence[str]) -> None:
        """The next `start` runs `argv` (another bundle's daemon); only while this one is stopped."""
        assert not self.running, "stop the running daemon first"
        self.argv = list(argv)
        self.ranks = DaemonRanks(expected_ranks(self.argv))
        self.version = None

    def last_lines(self, n: int = 10) -> list[str]:
        return list(self._child.last_lines)[-n:]

    async def start(self, record: Record) -> None:
        """A fresh run of the command (each run keeps its own last lines)."""
        # the daemon is vLLM code like the engine: no Corral secret in its environment either
        ranks = DaemonRanks(self.ranks.expected)
        self.ranks = ranks

        def line(text: str) -> None:
            ranks.note_line(text)
            self._echo(text)

        self._child = ChildProcess(
            "preload", self.argv, env=engine_environment({}), sink=line, inherit_env=False
        )
        self._stopping = False
        self.died.clear()
        # the installation this run starts on, read as PRECHECK reads it: what a switch compares
        self.version = (await asyncio.to_thread(daemon_install, self.argv)).version
        await self._child.start()
        self.starts += 1
        record(
            "preload_started", pid=self._child.pid, argv=self.argv, start=self.starts, version=self.version
        )
        self._watch = asyncio.create_task(self._watch_exit(self._child), name="preload-exit")
        self._rank_watch = asyncio.create_task(self._watch_ranks(self._child, ranks), name="preload-ranks")

    async def _watch_ranks(self, child: ChildProcess, ranks: DaemonRanks) -> None:
        """A lost rank: named, then the parent stopped (not by `stop`: its exit is the daemon's death)."""
        if child.pid is None:
            return
        reason = await ranks.watch(child.pid)
        if self._stopping or child is not self._child or not child.running:
            return
        if self.on_rank_lost is not None:
            self.on_rank_lost(self, reason)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGTERM)  # vLLM's launcher terminates the other ranks

    async def _watch_exit(self, child: ChildProcess) -> None:
        await child.wait(None)
        if self._rank_watch is not None and child is self._child:
            self._rank_watch.cancel()
        if self._stopping or child is not self._child:
            return
        if self.on_death is not None:
            self.on_death(self)
        self.died.set()

    async def wait_exit(self) -> int | None:
        """Blocks until this run of the daemon exits (at once if it has); no deadline, callers race it."""
        code = self._child.returncode
        while code is None and self._child.pid is not None:
            code = await self._child.wait(None)
        return code

    async def wait_healthy(self, session: aiohttp.ClientSession, within: float) -> str | None:
        """None once the health URL answers 200; else why not (the daemon exited, or the deadline)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while loop.time() < deadline:
            if not self._child.running:
                return f"preload daemon exited with code {self._child.returncode} before it was healthy"
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(self.health_url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return None
            await asyncio.sleep(0.1)
        return f"preload daemon not healthy at {self.health_url} within {within:g}s"

    async def stop(self, grace_seconds: float, record: Record) -> int | None:
        """Stop this run; a death that came before the stop is still reported (before this returns)."""
        was_running = self._child.running
        self._stopping = was_running
        if self._rank_watch is not None:
            self._rank_watch.cancel()
        code = await self._child.stop(grace_seconds)
        if was_running:
            record("preload_stopped", pid=self._child.pid, exit_code=code)
        if self._watch is not None:
            await self._watch
        return code

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "running": self.running,
            "argv": self.argv,
            "health": self.health_url,
            "starts": self.starts,
            "version": self.version,
            "ranks": self.ranks.to_json(),
            "ranks_expected": self.ranks.expected,
            "rank_lost": self.ranks.lost,
        }
