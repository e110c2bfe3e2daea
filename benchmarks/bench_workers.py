"""`corral router --workers N` against `--workers 1`, in one run over the same two fast simulators, and
the model for a bigger machine.

Layouts (`--layout`, on a 2-core machine; CPU ids are taken from this process's affinity):
  pinned  the load generator (this process) and the simulators on the first CPU, the router on the
          second: its workers share one core, so this prices N processes against one
  spread  the load generator and simulators on the first CPU, the router on both: its workers may
          use what the load generator leaves of the first core

Workloads: closed loop, `--clients` clients, zero think time, non-streamed and streamed chat. Each row:
requests/s, p50/p99, the router's CPU-seconds per 1000 requests (every worker's, parent included), the
CPU each side used per second of wall time (the router; the load generator with the simulators), and
how the requests split across workers (from the router's merged /metrics); before the load, the
router's idle CPU (each worker probes the engines on its own).

The model for C cores: a worker serves at most 1000 / (router CPU-s per 1000) requests per second of
one core, and the load generator with the simulators costs their CPU-s per 1000 requests; with R cores
for the router and C - R for the rest, requests/s ≈ min(R x per-core rate, (C - R) / their cost).

    .venv/bin/python benchmarks/bench_workers.py [--seconds 10] [--layout pinned,spread] [--workers 1,2]
        [--corral-args '--policy prefix']
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import psutil
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_router import MODEL, Proc, free_port, spawn, start_fast_sims, wait_ready
from loadgen import chat_body, run_closed_loop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from corral.engine.metrics_text import samples


def served_by_worker(router: str) -> dict[str, float]:
    with urllib.request.urlopen(router + "/metrics", timeout=10) as resp:
        page = resp.read()
    served: dict[str, float] = {}
    for sample in samples(page, ("corral_router_requests_total",)):
        worker = sample.labels.get("worker", "w1")
        served[worker] = served.get(worker, 0.0) + sample.value
    return served


def own_cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def run(label: str, router: Proc, sims: list[Proc], stream: bool, args: argparse.Namespace) -> dict[str, Any]:
    url = router.url + "/v1/chat/completions"
    before_split = served_by_worker(router.url)
    cpu_router, cpu_rest = router.cpu_seconds(), own_cpu() + sum(s.cpu_seconds() for s in sims)
    report = uvloop.run(
        run_closed_loop(
            "",
            [url],
            lambda i: chat_body(MODEL, stream, args.max_tokens, i),
            args.clients,
            1_000_000,
            args.seconds,
            stream=stream,
        )
    )
    router_s = router.cpu_seconds() - cpu_router
    rest_s = own_cpu() + sum(s.cpu_seconds() for s in sims) - cpu_rest
    after_split = served_by_worker(router.url)
    ok = len(report.ok)
    row = report.summary()
    row.update(
        target=label,
        workload="stream" if stream else "non-stream",
        router_cpu_s_per_1000=round(router_s / ok * 1000, 3) if ok else None,
        loadgen_and_sims_cpu_s_per_1000=round(rest_s / ok * 1000, 3) if ok else None,
        router_cores_busy=round(router_s / report.wall, 2),
        loadgen_and_sims_cores_busy=round(rest_s / report.wall, 2),
        per_worker={w: int(after_split.get(w, 0) - before_split.get(w, 0)) for w in sorted(after_split)},
    )
    if report.errors:
        row["error_kinds"] = report.error_kinds()
    return row


def model(rows: list[dict[str, Any]], cores: int) -> list[str]:
    """Requests/s on `cores` cores from the measured per-request CPU of each side."""
    lines = []
    for workload in ("non-stream", "stream"):
        mine = [r for r in rows if r["workload"] == workload and r["router_cpu_s_per_1000"]]
        if not mine:
            continue
        router_cost = min(r["router_cpu_s_per_1000"] for r in mine) / 1000
        rest_cost = min(r["loadgen_and_sims_cpu_s_per_1000"] for r in mine) / 1000
        best = max(
            (min(r_cores / router_cost, (cores - r_cores) / rest_cost), r_cores)
            for r_cores in range(1, cores)
        )
        lines.append(
            f"{workload}: one worker-core serves {1 / router_cost:,.0f} req/s; the Python load generator "
            f"with the simulators {1 / rest_cost:,.0f} req/s per core; on {cores} cores the best split is "
            f"{best[1]} router workers: ~{best[0]:,.0f} req/s (load-generator bound beyond it); with a "
            f"load generator off the machine, {cores} workers: ~{cores / router_cost:,.0f} req/s"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--workers", default="1,2", help="worker counts to compare, comma-separated")
    parser.add_argument("--layout", default="pinned,spread", help="pinned, spread, or both (comma-separated)")
    parser.add_argument("--model-cores", type=int, default=16)
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="idle CPU read before the load")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    parser.add_argument("--corral-args", default="", help="extra `corral router` flags, shell-split")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("bench_workers needs 2 CPUs: the load generator on one, the router on the other")
    first, second = {cpus[0]}, {cpus[1]}
    layouts = {"pinned": second, "spread": first | second}
    os.sched_setaffinity(0, first)
    rows: list[dict[str, Any]] = []
    sims = start_fast_sims(2, first, out, prefix="workers-sim")
    try:
        for layout in args.layout.split(","):
            for count in (int(n) for n in args.workers.split(",")):
                port = free_port()
                argv = [sys.executable, "-m", "corral", "router", "--host", "127.0.0.1", "--port", str(port)]
                argv += ["--workers", str(count), *(a for s in sims for a in ("--backend", s.url))]
                argv += shlex.split(args.corral_args)
                label = f"{layout} --workers {count}"
                router = spawn(
                    f"router-{layout}-{count}", argv, f"http://127.0.0.1:{port}", layouts[layout], out
                )
                try:
                    wait_ready(router, "/health")
                    time.sleep(1.0)  # every worker has probed the simulators
                    idle_from = router.cpu_seconds()
                    time.sleep(args.idle_seconds)
                    idle = (router.cpu_seconds() - idle_from) / args.idle_seconds
                    print(f"{label}: idle router {idle * 100:.1f}% of a core", flush=True)
                    uvloop.run(
                        run_closed_loop(
                            "warmup", [router.url + "/v1/chat/completions"],
                            lambda i: chat_body(MODEL, False, args.max_tokens, i), 16, 500, 5,
                        )
                    )  # fmt: skip
                    for stream in (False, True):
                        row = run(label, router, sims, stream, args)
                        rows.append(row)
                        print(orjson.dumps(row).decode(), flush=True)
                finally:
                    router.stop()
    finally:
        for sim in sims:
            sim.stop()
    for line in model(rows, args.model_cores):
        print(line)
    (out / "bench_workers.json").write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
