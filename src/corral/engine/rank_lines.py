"""vLLM's worker ranks as its log shows them: the per-process prefix (`(Worker_TP1 pid=4242)`,
`(VllmWorker-0 pid=…)`, `(VllmWorker rank=1 pid=…)`), the "rank R in world size W is assigned as …"
line, the lines that say a rank or a collective failed, and the world size a command line asks for."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from corral.engine.flags import flag_value, positive_int_flag

# `(NAME pid=N)` or `(NAME pid=N, ip=…)`, vLLM's `decorate_logs` prefix; several may nest (Ray, DP).
_PREFIX = re.compile(r"\((?P<name>[A-Za-z][\w\- =]*?) pid=(?P<pid>\d+)(?:, ip=[^)]*)?\)")
# the names vLLM gives a worker process, across versions:
#   VllmWorker-N (the multiprocessing name), VllmWorker rank=N (0.8), VllmWorker TP1 / PP0_TP1 (0.10),
#   Worker, Worker_TP1, Worker_DP0_PP1_TP1_EP3 (0.11 on)
_WORKER_NAME = re.compile(r"^(?:Vllm)?Worker(?:$|[-_ ])")
_INDEXED = re.compile(r"^VllmWorker(?:-| rank=)(?P<rank>\d+)$")
_PART = re.compile(r"(?:^|[_ ])(?P<axis>DP|PP|PCP|TP|DCP|EP)(?P<index>\d+)")
_ASSIGNED = re.compile(
    r"rank (?P<rank>\d+) in world size (?P<world>\d+) is assigned as "
    r"DP rank (?P<dp>\d+), PP rank (?P<pp>\d+),(?: PCP rank \d+,)? TP rank (?P<tp>\d+)"
)
# torch's c10d prefix on a rank's C++ log lines, and the rank the watchdog names
_TORCH_RANK = re.compile(r"\[[Rr]ank ?(?P<rank>\d+)\]")
_DIED_PROC = re.compile(r"Worker proc (?P<name>\S+) died unexpectedly")
_DIED_RAY = re.compile(r"RayWorkerProc rank=\[?(?P<rank>\d+)")

# failure kind -> substrings vLLM and torch log (case as they log them); the first that matches wins
_FAILURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("died", ("died unexpectedly, shutting down executor",)),
    ("collective_timeout", ("Watchdog caught collective operation timeout",)),
    (
        "collective_failed",
        ("Some NCCL operations have failed or timed out", "NCCL error in:", "DistBackendError"),
    ),
    ("engine_dead", ("EngineCore encountered an issue", "EngineDeadError")),
)


@dataclass(frozen=True)
class ParallelSize:
    """The ranks one engine command asks for: TP × PP workers per data-parallel engine core; `data_local`
    (`--data-parallel-size-local`) the data-parallel ranks on this host, None when all of them are."""

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    data_local: int | None = None

    @property
    def world(self) -> int:
        return self.tensor * self.pipeline * self.data

    @property
    def local(self) -> int:
        """The ranks this host's engine runs (and whose lines its log shows): TP × PP × local DP."""
        return self.tensor * self.pipeline * (self.data if self.data_local is None else self.data_local)


def parallel_size(argv: Sequence[str]) -> ParallelSize:
    """TP, PP, DP and local DP from a vLLM command line (1, or all DP ranks local, where not given);
    ValueError names a bad value."""
    local = flag_value(argv, "--data-parallel-size-local", "-dpl")
    return ParallelSize(
        positive_int_flag(argv, "--tensor-parallel-size", "-tp"),
        positive_int_flag(argv, "--pipeline-parallel-size", "-pp"),
        positive_int_flag(argv, "--data-parallel-size", "-dp"),
        None if local is None else positive_int_flag(argv, "--data-parallel-size-local", "-dpl"),
    )


@dataclass(frozen=True)
class ProcessPrefix:
    """The innermost `(NAME pid=N)` of a line: which process of the engine wrote it."""

    name: str
    pid: int

    @property
    def is_worker(self) -> bool:
        return bool(_WORKER_NAME.match(self.name))


def line_prefix(line: str) -> ProcessPrefix | None:
    prefixes = list(_PREFIX.finditer(line[:300]))
    if not prefixes:
        return None
    return ProcessPrefix(prefixes[-1]["name"], int(prefixes[-1]["pid"]))


def rank_of_name(name: str, size: ParallelSize) -> int | None:
    """The world rank a worker's name says (`VllmWorker-1` → 1; `Worker_PP1_TP0` with TP 2 → 2), or
    None when the name does not say it (a bare `Worker` in a world of more than one)."""
    indexed = _INDEXED.match(name)
    if indexed:
        return int(indexed["rank"])
    if not _WORKER_NAME.match(name):
        return None
    parts = {m["axis"]: int(m["index"]) for m in _PART.finditer(name.split("Worker", 1)[1])}
    if not {"TP", "PP", "DP"} & parts.keys():
        return 0 if size.world == 1 else None
    dp, pp, tp = parts.get("DP", 0), parts.get("PP", 0), parts.get("TP", 0)
    return (dp * size.pipeline + pp) * size.tensor + tp


@dataclass(frozen=True)
class RankAssignment:
    """vLLM's "rank R in world size W is assigned as DP rank d, PP rank p, …, TP rank t" line."""

    rank: int
    world_size: int
    dp: int
    pp: int
    tp: int


def rank_assignment(line: str) -> RankAssignment | None:
    found = _ASSIGNED.search(line)
    if found is None:
        return None
    return RankAssignment(*(int(found[k]) for k in ("rank", "world", "dp", "pp", "tp")))


@dataclass(frozen=True)
class RankFailure:
    """A log line saying a rank, a collective or the engine core failed; `rank` when the line names
    one (by its worker name, torch's `[Rank N]`, or the prefix of the process that wrote it)."""

    kind: str  # died | collective_timeout | collective_failed | engine_dead
    rank: int | None
    worker: str | None  # the worker name the line gives (`VllmWorker-1`), if any
    line: str


def rank_failure(line: str, size: ParallelSize) -> RankFailure | None:
    kind = next((k for k, needles in _FAILURES if any(n in line for n in needles)), None)
    if kind is None:
        return None
    worker: str | None = None
    rank: int | None = None
    if (died := _DIED_PROC.search(line)) is not None:
        worker = died["name"]
        rank = rank_of_name(worker, size)
    elif (ray := _DIED_RAY.search(line)) is not None:
        rank = int(ray["rank"])
    elif (torch_rank := _TORCH_RANK.search(line)) is not None:
        rank = int(torch_rank["rank"])
    elif (prefix := line_prefix(line)) is not None and prefix.is_worker:
        rank = rank_of_name(prefix.name, size)
    return RankFailure(kind, rank, worker, line)
