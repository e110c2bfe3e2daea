"""The worker ranks of one engine run: which process is which rank (from vLLM's log prefixes and its
rank-assignment line), whether each still lives (psutil), the first sign that one is lost (its process
gone while the engine runs, or a line naming a rank or collective failure), whether every rank the
command asks for has been seen and lives (`missing`: what READY and the runbook's checks require), and,
at stop, the end of every process the engine's tree ever held, so no rank outlives its engine into the
next start (a rank that ends once the stop began is the stop's, never a loss)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from corral.engine.rank_lines import (
    ParallelSize,
    RankFailure,
    line_prefix,
    rank_assignment,
    rank_failure,
    rank_of_name,
)
from corral.process_identity import live_process


@dataclass
class Rank:
    """One worker rank as last seen. `alive` is None for a process that is not the engine's own (a
    line that names a pid outside its tree), whose liveness says nothing of the engine."""

    rank: int
    name: str
    pid: int
    create_time: float | None
    alive: bool | None
    since: float = field(default_factory=time.time)  # first seen alive, or found dead

    def label(self) -> str:
        return f"rank {self.rank} ({self.name} pid {self.pid})"

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "name": self.name,
            "pid": self.pid,
            "alive": self.alive,
            "since": self.since,
        }


@dataclass(frozen=True)
class RankLoss:
    """Why the engine lost a rank, with the evidence; `rank` is None when no rank could be named."""

    rank: int | None
    reason: str
    evidence: dict[str, Any]


def _log_text(line: str) -> str:
    """A log line without vLLM's "(proc pid=N) LEVEL time [file:line]" prefix, short enough for a reason."""
    return line.split("] ", 1)[-1].strip()[:200]


_FAILURE_WORDS = {
    "died": "died",
    "collective_timeout": "collective operation timed out",
    "collective_failed": "collective (NCCL) operation failed",
    "engine_dead": "engine core dead",
}


class EngineRanks:
    """The ranks of one engine run. Fed every engine log line (`note_line`); `refresh()` reads the
    process tree; `watch()` returns the first `RankLoss`; `reap()` ends what outlived the engine."""

    def __init__(self, size: ParallelSize, poll_seconds: float = 0.5) -> None:
        self.size = size
        self.poll_seconds = poll_seconds
        self._ranks: dict[int, Rank] = {}
        self._root: tuple[int, float] | None = None
        self._tree: dict[int, float] = {}  # every descendant ever seen: pid -> create time
        self._loss: RankLoss | None = None
        self._changed = asyncio.Event()
        self._stopping = False  # the engine is being stopped: its ranks end with it

    @property
    def loss(self) -> RankLoss | None:
        return self._loss

    def stopping(self) -> None:
        """The engine is being stopped (SIGTERM to its group): no rank that ends from here on is lost."""
        self._stopping = True

    def attach(self, pid: int, create_time: float) -> None:
        """The engine's own process, whose descendants the ranks are."""
        self._root = (pid, create_time)
        self.refresh()

    # -- what the log says --------------------------------------------------------------------

    def note_line(self, line: str) -> None:
        prefix = line_prefix(line)
        assigned = rank_assignment(line)
        if assigned is not None and prefix is not None:
            self._seen(assigned.rank, prefix.name, prefix.pid)
        elif prefix is not None and prefix.is_worker:
            known = next((r for r in self._ranks.values() if r.pid == prefix.pid), None)
            if known is not None:
                if prefix.name != "Worker":  # the bare name says less than the one already known
                    known.name = prefix.name
            elif (rank := rank_of_name(prefix.name, self.size)) is not None:
                self._seen(rank, prefix.name, prefix.pid)
        failure = rank_failure(line, self.size)
        if failure is not None and self._loss is None and not self._stopping:
            self.refresh(tree=False, lose=False)  # a rank already gone is the one the line is about
            self._lose(self._from_line(failure))

    def _seen(self, rank: int, name: str, pid: int) -> None:
        known = self._ranks.get(rank)
        if known is not None and known.pid == pid:
            if name != "Worker":
                known.name = name
            return
        proc = live_process(pid, None)
        ours = proc is not None and (pid == self._root_pid or pid in self._descendants())
        create_time = _create_time(proc)
        alive: bool | None = True if ours else (None if proc is not None else False)
        self._ranks[rank] = Rank(rank, name, pid, create_time, alive)
        if alive is False and not self._stopping and self._root_alive():  # named by its line, gone before
            self._died(self._ranks[rank])

    def _from_line(self, failure: RankFailure) -> RankLoss:
        rank, kind = failure.rank, failure.kind
        if rank is None and kind == "engine_dead":  # vLLM may say this before it names the dead worker
            rank = next((r.rank for r in self._ranks.values() if r.alive is False), None)
            kind = "died" if rank is not None else kind
        known = self._ranks.get(rank) if rank is not None else None
        if known is not None:
            who = known.label()
        elif rank is not None:
            who = f"rank {rank}" + (f" ({failure.worker})" if failure.worker else "")
        else:
            who = "a rank"
        text = _log_text(failure.line)
        what = _FAILURE_WORDS[kind]
        reason = f"{what}: {text}" if kind == "engine_dead" else f"{who} {what}: {text}"
        return RankLoss(rank, reason, self._evidence(rank, kind, line=failure.line[:500]))

    # -- what the process table says ----------------------------------------------------------

    @property
    def _root_pid(self) -> int | None:
        return self._root[0] if self._root is not None else None

    def _root_alive(self) -> bool:
        return self._root is not None and live_process(*self._root) is not None

    def _descendants(self) -> dict[int, float]:
        """The engine's descendants now (pid -> create time), added to every one seen before."""
        if self._root is None or (root := live_process(*self._root)) is None:
            return {}
        now: dict[int, float] = {}
        with contextlib.suppress(psutil.Error):
            for child in root.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    now[child.pid] = child.create_time()
        for pid, created in now.items():
            self._tree.setdefault(pid, created)
        return now

    def refresh(self, tree: bool = True, lose: bool = True) -> None:
        """Mark ranks that are gone (with `lose`, the first is the loss while the engine runs); with
        `tree`, first remember the engine's new descendants."""
        if tree:
            self._descendants()
        for rank in self._ranks.values():
            if rank.alive is not True:
                continue
            if live_process(rank.pid, rank.create_time) is None:
                rank.alive = False
                rank.since = time.time()
                # a rank gone with its whole engine is its exit; one gone in the stop is the stop's
                if lose and not self._stopping and self._root_alive():
                    self._died(rank)

    def _died(self, rank: Rank) -> None:
        if self._loss is None:
            self._lose(
                RankLoss(
                    rank.rank,
                    f"{rank.label()} died (its process is gone while the engine runs)",
                    self._evidence(rank.rank, "died"),
                )
            )

    def _lose(self, loss: RankLoss) -> None:
        self._loss = loss
        self._changed.set()

    def _evidence(self, rank: int | None, kind: str, **extra: Any) -> dict[str, Any]:
        return {"source": "rank_watch", "rank": rank, "kind": kind, **extra, "ranks": self.ranks_json()}

    async def watch(self) -> RankLoss:
        """Returns the first loss of a rank (at once if one is already known); polls meanwhile."""
        while self._loss is None:
            self.refresh()
            self._changed.clear()
            if self._loss is not None:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.poll_seconds)
        return self._loss

    def missing(self) -> str | None:
        """None when the ranks are whole: every rank this host runs (TP × PP × local DP) seen in the log
        and none lost or gone. An engine of one rank runs it in its own engine core, whose liveness is
        the engine's: nothing more to see. Otherwise which rank is lost, gone or not seen, in words."""
        self.refresh(tree=False)
        if self._loss is not None:
            return self._loss.reason
        gone = [r for r in self._ranks.values() if r.alive is False]
        if gone:
            return f"{gone[0].label()} is gone"
        need = self.size.local
        if need <= 1 or len(self._ranks) >= need:
            return None
        if self.size.data_local is None:
            unseen = [r for r in range(need) if r not in self._ranks]
            which = ", ".join(f"rank {r}" for r in unseen)
        else:
            which = f"{need - len(self._ranks)} of the {need} ranks on this host"
        return (
            f"{which} not seen in the engine's log ({len(self._ranks)} of {need} seen; world size "
            f"{self.size.world} = TP {self.size.tensor} × PP {self.size.pipeline} × DP {self.size.data}); "
            "vLLM logs each rank's assignment at INFO: is VLLM_LOGGING_LEVEL above INFO?"
        )

    def summary(self) -> dict[str, Any]:
        """The ranks at one moment, for a change record's before and after: the world size, the ranks
        on this host, how many were seen and live, whether they are whole (`missing` is why not),
        the loss if one is known, and every rank."""
        missing = self.missing()
        return {
            "world_size": self.size.world,
            "local": self.size.local,
            "seen": len(self._ranks),
            "alive": sum(1 for r in self._ranks.values() if r.alive is True),
            "whole": missing is None,
            "missing": missing,
            "lost": self._loss.reason if self._loss is not None else None,
            "ranks": self.ranks_json(),
        }

    def final_loss(self) -> RankLoss | None:
        """After the engine exited: a rank lost before it (named by a line or found dead), if any."""
        self.refresh(tree=False)
        return self._loss

    # -- the end of the run -------------------------------------------------------------------

    def survivors(self) -> dict[int, float]:
        """Every process of the engine's tree (ranks included) still running: pid -> create time."""
        seen = dict(self._tree)
        for rank in self._ranks.values():
            if rank.alive is not None and rank.create_time is not None:  # never a pid seen only by name
                seen.setdefault(rank.pid, rank.create_time)
        return {pid: created for pid, created in seen.items() if live_process(pid, created) is not None}

    async def reap(self, within: float = 5.0) -> list[int]:
        """SIGKILL whatever of the engine's tree outlived it (a rank in a session of its own escapes
        the group kill) and wait, up to `within` seconds, until it is gone. Returns the pids killed."""
        left = self.survivors()
        killed = sorted(left)
        for pid, created in left.items():
            if (proc := live_process(pid, created)) is not None:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        deadline = time.monotonic() + within
        while left and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            left = {pid: c for pid, c in left.items() if live_process(pid, c) is not None}
        self.refresh(tree=False)
        return killed

    # -- what /v1/state shows -----------------------------------------------------------------

    def ranks_json(self) -> list[dict[str, Any]]:
        return [self._ranks[k].to_json() for k in sorted(self._ranks)]

    def to_json(self) -> dict[str, Any]:
        """`ranks` and `world_size` for /v1/state (liveness read now)."""
        self.refresh(tree=False)
        return {"world_size": self.size.world, "ranks": self.ranks_json()}


def _create_time(proc: psutil.Process | None) -> float | None:
    if proc is None:
        return None
    try:
        return float(proc.create_time())
    except psutil.Error:
        return None
