"""What a router costs while no request comes: the CPU of `corral router` (process and children) over two
idle `corral sim` engines, per variant, in the same run — its background work alone (engine-metrics
scraper, health probes, timers), which a fixed request rate pays per request (at 200 req/s, 1 ms of CPU
a second is 5 µs a request).

Variants: `--policy round_robin` (no scraper), `round_robin --flow-control` (flow control's own
scraper), `--policy load` (routing's scraper). With `--baseline-src DIR`, each variant again from another
checkout's `src/` (e.g. an archive of the commit before a change), and the ratios.

    .venv/bin/python benchmarks/bench_router_idle.py [--seconds 20] [--baseline-src DIR]

Loopback only; bounded in time; every process is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_router import Proc, free_port, spawn, start_fast_sims, wait_ready

VARIANTS = {
    "round_robin": ["--policy", "round_robin"],
    "round_robin --flow-control": ["--policy", "round_robin", "--flow-control"],
    "load": ["--policy", "load"],
}


def cpu_seconds(proc: Proc) -> float:
    root = psutil.Process(proc.popen.pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        times = p.cpu_times()
        total += times.user + times.system
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="idle time measured (after 3 s settling)")
    parser.add_argument("--baseline-src", default=None, help="another checkout's src/ to run beside")
    args = parser.parse_args()
    if not 1 <= args.seconds <= 600:
        parser.error(f"--seconds {args.seconds}: give 1 to 600")
    out = Path(tempfile.mkdtemp(prefix="bench-router-idle-"))
    trees: dict[str, dict[str, str] | None] = {"this tree": None}
    if args.baseline_src:
        trees["baseline"] = {**os.environ, "PYTHONPATH": str(Path(args.baseline_src).resolve())}
    procs: list[Proc] = []
    try:
        sims = start_fast_sims(2, None, out)
        procs += sims
        routers: dict[tuple[str, str], Proc] = {}
        for tree, env in trees.items():
            for variant, flags in VARIANTS.items():
                port = free_port()
                argv = [sys.executable, "-m", "corral", "router", "--host", "127.0.0.1", "--port", str(port)]
                argv += flags
                for sim in sims:
                    argv += ["--backend", sim.url]
                name = f"router-{len(routers)}"
                proc = spawn(name, argv, f"http://127.0.0.1:{port}", None, out, env)
                procs.append(proc)
                wait_ready(proc, "/health")
                routers[(tree, variant)] = proc
        time.sleep(3.0)  # every router has found its engines READY and started its timers
        before = {key: cpu_seconds(proc) for key, proc in routers.items()}
        started = time.monotonic()
        time.sleep(args.seconds)
        elapsed = time.monotonic() - started
        cost = {key: (cpu_seconds(proc) - before[key]) / elapsed * 1000 for key, proc in routers.items()}
        print(f"router CPU while idle, ms per second, over {elapsed:.1f} s (two idle engines):")
        for (tree, variant), ms in cost.items():
            print(f"  {tree:9}  {variant:28} {ms:6.2f}")
        if args.baseline_src:
            for variant in VARIANTS:
                base = cost[("baseline", variant)]
                if base:
                    print(f"  this tree / baseline, {variant}: {cost[('this tree', variant)] / base:.2f}")
    finally:
        for proc in reversed(procs):
            proc.stop()


if __name__ == "__main__":
    main()
