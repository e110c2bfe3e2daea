"""Rank-loss benchmark (not a test): how fast a supervisor takes a READY engine out of routing when
one of its worker ranks dies, and how long RECOVER takes to bring it back.

Setup: one `corral supervise` over `corral sim --tensor-parallel-size 2` (one worker process per rank).
Each round SIGKILLs rank 1 of the READY engine, then waits for READY again with two new ranks.

Measured (wall clock of this host, the supervisor's oplog stamps against the moment of the kill):
  detection   the SIGKILL -> the READY -> FAILED transition naming the rank
  recovery    the SIGKILL -> READY again (stop, restart backoff, the sim's startup, readiness); the
              backoff doubles from --restart-backoff 0.2 s with each round, as the budget is spent

    PYTHONPATH=. .venv/bin/python benchmarks/bench_rank_loss.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time
from typing import Any

from tests.integration.test_supervisor_support import supervised


def _ready_with_ranks(body: dict[str, Any]) -> bool:
    ranks = body.get("ranks") or []
    return body.get("state") == "READY" and len(ranks) == 2 and all(r["alive"] for r in ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    detection: list[float] = []
    recovery: list[float] = []
    with supervised(
        sim_args=("--tensor-parallel-size", "2"),
        sup_args=("--failure-restarts", str(args.rounds + 1)),
    ) as sup:
        for _ in range(args.rounds):
            body = sup.wait_for("READY with 2 ranks", _ready_with_ranks, 60)
            victim = next(r["pid"] for r in body["ranks"] if r["rank"] == 1)
            killed_at = time.time()
            os.kill(victim, signal.SIGKILL)
            sup.wait_for("out of READY", lambda b: b["state"] != "READY", 30)
            failed = [t for t in sup.transitions() if t["to"] == "FAILED"][-1]
            detection.append(failed["time"] - killed_at)
            sup.wait_for("READY again", _ready_with_ranks, 60)
            ready = [t for t in sup.transitions() if t["to"] == "READY"][-1]
            recovery.append(ready["time"] - killed_at)
            took = f"detection {detection[-1] * 1000:7.1f} ms  recovery {recovery[-1]:5.2f} s"
            print(f"{took}  {failed['reason'][:80]}")
    print(
        f"detection median {statistics.median(detection) * 1000:.1f} ms, max {max(detection) * 1000:.1f} ms; "
        f"recovery median {statistics.median(recovery):.2f} s over {args.rounds} rounds"
    )


if __name__ == "__main__":
    main()
