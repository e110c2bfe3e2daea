"""The preload daemon's ranks, watched like the engine's (issue 29 item 5; the runbook's Preload VERIFY:
"daemon parent health 200 and every rank process alive").

What vLLM gives to watch (entrypoints/cli/preload.py, weight_cache/daemon.py): the `vllm preload` parent
starts one rank process per local GPU, in global-rank order, as multiprocessing children (plus
multiprocessing's resource tracker); each rank logs `Weight cache target daemon rank R serving on PATH`
once its socket is bound; the parent's `/health` turns 503 once any rank process has exited, but the
parent itself lives on while another rank does — so a TP daemon that lost a rank is still "running",
and an engine restarted on it would find no socket for that rank's GPU. The rank lines carry no pid, so
a rank's number is its start order among the parent's children (vLLM starts them one after another).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from corral.engine.flags import daemon_words
from corral.engine.rank_lines import parallel_size
from corral.supervisor.precheck.preload_identity import command_of

# bounded: a rank of at most 6 digits, a socket path of at most 4,096 characters (a daemon's log line is
# untrusted input: int() of a 5,000-digit run raises)
_SERVING = re.compile(
    r"Weight cache (?P<role>target|draft) daemon rank (?P<rank>\d{1,6}) serving on (?P<path>\S{1,4096})"
)
# ranks remembered per run: far more than any daemon's TP x PP x local DP
MAX_SERVING = 1024
_LAUNCHER = ("preload",)  # `vllm preload`, `corral sim preload`: the process whose children are the ranks
_NOT_A_RANK = ("resource_tracker", "semaphore_tracker")


def expected_ranks(argv: Sequence[str]) -> int:
    """TP × PP × local DP of the daemon's command (1 when it cannot be read)."""
    try:
        return parallel_size(command_of(daemon_words(argv)).argv).local
    except ValueError:
        return 1


@dataclass(frozen=True)
class DaemonRank:
    rank: int
    pid: int


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def rank_processes(daemon_pid: int) -> list[DaemonRank]:
    """The rank processes under the daemon, in start order: the children of the process that runs
    `… preload …` (the daemon itself, or the command a wrapper started), not multiprocessing's tracker."""
    try:
        root = psutil.Process(daemon_pid)
        family = [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
    launcher = next((p for p in family if any(w in _LAUNCHER for w in _cmdline(p))), root)
    try:
        children = launcher.children(recursive=False)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
    ranks = [c for c in children if not any(t in " ".join(_cmdline(c)) for t in _NOT_A_RANK)]

    def started(p: psutil.Process) -> tuple[float, int]:
        try:
            return (p.create_time(), p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return (float("inf"), p.pid)

    return [DaemonRank(i, p.pid) for i, p in enumerate(sorted(ranks, key=started))]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class DaemonRanks:
    """One run's ranks: who logged that it serves (and where), their processes, and the first loss."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.serving: dict[int, str] = {}
        self.processes: list[DaemonRank] = []
        self.lost: str | None = None

    def note_line(self, line: str) -> None:
        found = _SERVING.search(line)
        if found is not None and found["role"] == "target":
            rank = int(found["rank"])
            if rank in self.serving or len(self.serving) < MAX_SERVING:
                self.serving[rank] = found["path"]

    @property
    def all_serving(self) -> bool:
        return len(self.serving) >= self.expected

    async def watch(self, daemon_pid: int, every: float = 0.25) -> str:
        """Returns why a rank is lost, once one is: every expected rank process was found under the
        daemon (the serving lines are not waited for: under VLLM_LOGGING_LEVEL=WARNING there are none),
        then one of them is gone. Runs until then."""
        while len(self.processes) < self.expected:
            self.processes = rank_processes(daemon_pid)
            await asyncio.sleep(every)
        while True:
            gone = [r for r in self.processes if not alive(r.pid)]
            if gone:
                first = gone[0]
                left = [r.rank for r in self.processes if r not in gone]
                self.lost = (
                    f"preload daemon rank {first.rank} (pid {first.pid}) died; ranks still running: "
                    f"{left or 'none'} of {self.expected}: the daemon's /health is 503 and an engine on "
                    f"rank {first.rank}'s GPU finds no weights"
                )
                return self.lost
            await asyncio.sleep(every)

    def to_json(self) -> list[dict[str, Any]]:
        pids = {r.rank: r.pid for r in self.processes}
        ranks = sorted(set(self.serving) | set(pids))
        return [
            {
                "rank": rank,
                "pid": pids.get(rank),
                "alive": alive(pids[rank]) if rank in pids else None,
                "socket": self.serving.get(rank),
            }
            for rank in ranks
        ]
