"""One simulated tensor-parallel worker process (`python -m corral.sim.worker --rank i --world-size N`),
the child vLLM's multiproc executor starts per GPU rank.

It logs as vLLM's workers do (`(Worker_TP{i} pid=...)`, the rank assignment line; nothing with `--quiet`,
the sim's `--unlogged-rank`), then lives on its
stdin: the engine sends one JSON command per line (`{"log": [level, where, message]}` to log a per-rank
line, `{"die": reason}` to fail as a crashed rank does), and EOF means the engine is gone, by shutdown or by
its death, so the worker exits then: it can never outlive its engine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from corral.sim.core.logs import EngineLog


def worker_name(rank: int, world_size: int) -> str:
    """vLLM's log prefix of a worker: `Worker` alone, `Worker_TP{rank}` under tensor parallelism."""
    return f"Worker_TP{rank}" if world_size > 1 else "Worker"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corral.sim.worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-method", default="tcp://127.0.0.1:0")
    parser.add_argument("--ready-fd", type=int, default=None, help="a pipe to write READY to, then close")
    parser.add_argument("--quiet", action="store_true", help="log nothing (the sim's --unlogged-rank)")
    args = parser.parse_args(argv)
    # A signal to the whole process group (Ctrl-C, a supervisor's SIGTERM) is the engine's to handle; the
    # worker leaves when the engine closes its pipe. Only SIGKILL takes a rank down on its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log = EngineLog() if not args.quiet else None
    name, rank, world = worker_name(args.rank, args.world_size), args.rank, args.world_size
    if log is not None:
        _assigned(log, name, rank, world, args.init_method)
    if args.ready_fd is not None:
        os.write(args.ready_fd, b"READY")
        os.close(args.ready_fd)
    for raw in sys.stdin:
        try:
            command = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(command, dict) and "die" in command:
            if log is not None:
                log.error(name, "multiproc_executor.py:702", "WorkerProc hit an exception.")
                log.error(name, "multiproc_executor.py:702", str(command["die"]))
            os._exit(1)
    if log is not None:
        log.info(name, "multiproc_executor.py:558", "Parent process exited, terminating worker")
        log.info(name, "multiproc_executor.py:599", "WorkerProc shutting down.")
    return 0


def _assigned(log: EngineLog, name: str, rank: int, world: int, init_method: str) -> None:
    """The two lines a worker logs as it joins the process group, the second naming its rank."""
    log.info(
        name,
        "parallel_state.py:1906",
        f"world_size={world} rank={rank} local_rank={rank} "
        f"distributed_init_method={init_method} backend=nccl",
    )
    log.info(
        name,
        "parallel_state.py:2350",
        f"rank {rank} in world size {world} is assigned as DP rank 0, PP rank 0, PCP rank 0, "
        f"TP rank {rank}, ETP rank {rank}, EP rank N/A, EPLB rank N/A",
    )


if __name__ == "__main__":
    sys.exit(main())
