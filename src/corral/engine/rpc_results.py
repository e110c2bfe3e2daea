"""What one vLLM `POST /collective_rpc` call did on each worker rank. vLLM answers 200
`{"results": [...]}`, one entry per worker of the engine core in rank order (null where the method
returns None, as `reload_weights` does), or, when a rank raised, the engine core's 500 `Worker failed
with error '...'`, which names no rank: the rank is the worker whose own log line says
`WorkerProc hit an exception.` (its `(Worker_TP1 pid=…)` prefix), the exception on its last line. A
single-rank engine runs its worker in the engine core (no worker process, no such line): rank 0."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.engine.rank_lines import ParallelSize, line_prefix, rank_of_name

# vLLM's WorkerProc logs this (with the traceback) when the method it was asked to run raised
WORKER_EXCEPTION = "WorkerProc hit an exception."


@dataclass(frozen=True)
class RankResult:
    """One rank's part of the call: `ok`, what it returned, and the worker and line when it failed."""

    rank: int | None  # None: a failing worker whose name does not say its rank
    ok: bool
    result: Any = None
    worker: str | None = None
    pid: int | None = None
    error: str | None = None

    def label(self) -> str:
        where = f"rank {self.rank}" if self.rank is not None else "a rank"
        return f"{where} ({self.worker} pid {self.pid})" if self.worker is not None else where

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"rank": self.rank, "ok": self.ok, "result": self.result}
        if not self.ok:
            body.update(worker=self.worker, pid=self.pid, error=self.error)
        return body


def ranks_per_core(size: ParallelSize) -> int:
    """The workers one engine core's collective RPC answers for: TP × PP (each data-parallel core
    has its own)."""
    return size.tensor * size.pipeline


def answered_ranks(body: Any, size: ParallelSize) -> tuple[list[RankResult], str | None]:
    """The per-rank results of a 200 answer, and what is wrong with them (None: one result per rank).
    A data-parallel engine may answer for one core's ranks or for all of them; both are accepted."""
    results = body.get("results") if isinstance(body, dict) else None
    if not isinstance(results, list):
        return [], (
            f"collective_rpc answered {str(body)[:120]!r}, not {{'results': [...]}}: no rank said it finished"
        )
    ranks = [RankResult(rank, True, result) for rank, result in enumerate(results)]
    want = ranks_per_core(size)
    allowed = {want, size.world}
    if len(results) not in allowed:
        return ranks, (
            f"collective_rpc answered {len(results)} results for {want} rank(s) "
            f"(TP {size.tensor} × PP {size.pipeline}): not every rank answered"
        )
    return ranks, None


def failed_ranks(lines: Sequence[str], size: ParallelSize) -> list[RankResult]:
    """The ranks whose worker logged `WorkerProc hit an exception.` in `lines` (the engine's log since
    the call), each with the last line its process wrote after it (the exception, under the traceback)."""
    failed: list[RankResult] = []
    for index, line in enumerate(lines):
        if WORKER_EXCEPTION not in line:
            continue
        prefix = line_prefix(line)
        if prefix is None or not prefix.is_worker:
            continue
        if any(r.pid == prefix.pid for r in failed):
            continue
        own = [later for later in lines[index + 1 :] if (p := line_prefix(later)) and p.pid == prefix.pid]
        error = own[-1].split("] ", 1)[-1].strip()[:300] if own else None
        rank = rank_of_name(prefix.name, size)
        failed.append(RankResult(rank, False, None, prefix.name, prefix.pid, error))
    return failed
