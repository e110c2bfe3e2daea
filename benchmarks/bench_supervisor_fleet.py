"""1,000 supervisor state streams into one router (issue 17, item 4): how long until a router started
on a backends file of 1,000 `engine=supervisor` pairs routes to all of them, what the 1,000 open
NDJSON streams cost it idle and with state changes, how fast a DRAINING line is acknowledged at that
size, and the router's memory.

Setup, all on loopback and bounded:
- the fake engines of bench_scale (benchmarks/scale_fleet.py: real vLLM answers, one process, one
  port each) on the CPUs other than 0;
- 1,000 scripted supervisors on one port in this process (bench_supervisor_streams.ScriptedSupervisors:
  `GET /eN/v1/state/watch` as `corral supervise` streams it, heartbeats at the interval the router asks,
  `POST /eN/v1/acks` recorded);
- `corral router --backends-file` (round_robin, one worker) pinned to CPU 0.

Measured: seconds from the router's start until all are routable; router CPU (psutil, per second,
median) idle with every stream open, then with `--rate` state changes a second (one engine at a time
READY -> DRAINING -> READY); DRAINING line written -> acknowledgement received (p50/p99; one clock,
CLOCK_MONOTONIC, for every process); the router's RSS.

    .venv/bin/python benchmarks/bench_supervisor_fleet.py [--engines 1000] [--seconds 30] [--rate 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_membership import quantile, routable
from bench_router import Proc, free_port, spawn
from bench_supervisor_streams import ScriptedSupervisors, flipper
from scale_fleet import start_engines


def cpu_per_second(router: Proc, seconds: float) -> list[float]:
    samples = []
    last, last_t = router.cpu_seconds(), time.monotonic()
    end = last_t + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        now, cpu = time.monotonic(), router.cpu_seconds()
        samples.append((cpu - last) / (now - last_t))
        last, last_t = cpu, now
    return samples


def rss_mib(router: Proc) -> float:
    root = psutil.Process(router.popen.pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--engines", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0, help="per phase")
    parser.add_argument("--rate", type=float, default=10.0, help="state changes per second")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-supervisor-fleet-"))
    cpus = set(os.sched_getaffinity(0))
    others = (cpus - {0}) or cpus
    os.sched_setaffinity(0, others)  # this process serves the supervisors: keep it off the router's CPU
    engines, urls, _ = start_engines(args.engines, out, others)
    sups = ScriptedSupervisors(args.engines)
    sups.start()
    router: Proc | None = None
    try:
        backends = out / "backends.txt"
        backends.write_text("".join(f"{u}={sups.url(f'e{i}')}\n" for i, u in enumerate(urls)))
        port = free_port()
        argv = [sys.executable, "-m", "corral", "router", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--backends-file", str(backends), "--policy", "round_robin", "--router-id", "bench"]
        argv += ["--workers", "1", "--log-level", "warning"]
        t0 = time.monotonic()
        router = spawn("router", argv, f"http://127.0.0.1:{port}", {0} & cpus or cpus, out)
        while True:
            if router.popen.poll() is not None or time.monotonic() - t0 > 300:
                raise SystemExit(f"the router did not route to every engine (see {out}/router.log)")
            try:
                if routable(router.url) >= args.engines:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        ready_s = time.monotonic() - t0
        streams = sum(len(q) for q in sups.streams.values())
        print(f"{args.engines} supervised engines routable {ready_s:.1f} s after the router started")
        print(f"open state streams: {streams}; router RSS {rss_mib(router):.0f} MiB", flush=True)
        time.sleep(3)
        load1 = os.getloadavg()[0]
        idle = cpu_per_second(router, args.seconds)
        print(
            f"idle, {streams} streams: router CPU median {statistics.median(idle) * 100:.2f}%"
            f" of a core (load avg {load1:.2f})",
            flush=True,
        )
        stop = threading.Event()
        thread = flipper(sups, 1.0 / args.rate, stop)
        load1 = os.getloadavg()[0]
        changing = cpu_per_second(router, args.seconds)
        stop.set()
        thread.join(5)
        for name, (state, _) in list(sups.states.items()):
            if state == "DRAINING":  # the flipper stopped between down and up: bring it back
                sups.flip(name)
        time.sleep(2.0)
        print(
            f"{args.rate:g} state changes/s: router CPU median {statistics.median(changing) * 100:.2f}%"
            f" of a core (load avg {load1:.2f})"
        )
        acks = [sups.acked[k] - t for k, t in sups.written.items() if k in sups.acked]
        print(
            f"DRAINING written -> acknowledged ({len(acks)} of {len(sups.written)}): "
            f"p50 {quantile(acks, 0.5) * 1000:.1f} ms  p99 {quantile(acks, 0.99) * 1000:.1f} ms  "
            f"max {quantile(acks, 1.0) * 1000:.1f} ms"
        )
        print(f"router RSS at the end {rss_mib(router):.0f} MiB; routable at the end {routable(router.url)}")
    finally:
        if router is not None:
            router.stop()
        engines.stop()


if __name__ == "__main__":
    main()
