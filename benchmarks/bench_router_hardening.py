"""What the router's hardening costs: `corral router` open (every client limit off, no tenants) against
`corral router` hardened (the shipped client limits plus an API-keys file of N tenants, the load sending
one tenant's key), over the same two simulators, in interleaved rounds (open, hardened, open, …) so
that drift on a shared machine falls on both alike.

Each round is a closed loop of `--clients` clients for `--seconds`, non-streamed or streamed; the
figures are each target's median requests/s and median router CPU-seconds per 1000 requests over the
rounds, and their ratios (hardened / open). Loopback only; bounded in count and time.
    .venv/bin/python benchmarks/bench_router_hardening.py [--rounds 5] [--seconds 6] [--tenants 1000] [--pin]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_router import (
    LIMITS_OFF,
    MODEL,
    ROOT,
    Proc,
    free_port,
    spawn,
    start_fast_sims,
    wait_ready,
    write_tenants,
)
from loadgen import JSON_HEADERS, chat_body, run_closed_loop


def start_router(name: str, flags: list[str], sims: list[Proc], cpus: set[int] | None, out: Path) -> Proc:
    port = free_port()
    argv = [sys.executable, "-m", "corral", "router", "--host", "127.0.0.1", "--port", str(port), *flags]
    argv += ["--workers", "1"]  # one router process, as this benchmark always measured
    for s in sims:
        argv += ["--backend", s.url]
    router = spawn(name, argv, f"http://127.0.0.1:{port}", cpus, out)
    wait_ready(router, "/health")
    return router


def one_round(
    router: Proc, headers: dict[str, str], stream: bool, clients: int, seconds: float
) -> dict[str, Any]:
    cpu_before = router.cpu_seconds()
    report = uvloop.run(
        run_closed_loop(
            "",
            [router.url + "/v1/chat/completions"],
            lambda i: chat_body(MODEL, stream, 8, i),
            clients,
            1_000_000,
            seconds,
            stream=stream,
            headers=headers,
        )
    )
    ok = len(report.ok)
    cpu = router.cpu_seconds() - cpu_before
    return {
        "rps": ok / report.wall,
        "cpu_per_1000": cpu / ok * 1000 if ok else float("nan"),
        "errors": report.errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--pin", action="store_true", help="routers on CPU 1, simulators and load on CPU 0")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/out"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    router_cpus = {1} if args.pin else None
    other_cpus = {0} if args.pin else None
    if other_cpus:
        os.sched_setaffinity(0, other_cpus)

    procs: list[Proc] = []
    try:
        sims = start_fast_sims(2, other_cpus, out, prefix="hardening-sim")
        procs += sims
        keys_file, key = write_tenants(out, args.tenants) if args.tenants else (None, "")
        open_router = start_router("hardening-open", LIMITS_OFF, sims, router_cpus, out)
        procs.append(open_router)
        tenant_flags = ["--api-keys-file", str(keys_file)] if keys_file else []  # --tenants 0: limits alone
        hardened = start_router("hardening-on", tenant_flags, sims, router_cpus, out)
        procs.append(hardened)
        targets = {
            "open": (open_router, dict(JSON_HEADERS)),
            "hardened": (
                hardened,
                {**JSON_HEADERS, "Authorization": f"Bearer {key}"} if key else dict(JSON_HEADERS),
            ),
        }
        for router, headers in targets.values():  # warm-up
            one_round(router, headers, False, 16, 2.0)
        summary: list[dict[str, Any]] = []
        for stream in (False, True):
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
            for _ in range(args.rounds):
                for name, (router, headers) in targets.items():
                    runs[name].append(one_round(router, headers, stream, args.clients, args.seconds))
            row: dict[str, Any] = {"workload": "stream" if stream else "non-stream", "rounds": args.rounds}
            for name, samples in runs.items():
                row[f"{name}_rps"] = round(statistics.median(s["rps"] for s in samples), 1)
                row[f"{name}_cpu_s_per_1000"] = round(
                    statistics.median(s["cpu_per_1000"] for s in samples), 4
                )
                row[f"{name}_errors"] = sum(s["errors"] for s in samples)
                row[f"{name}_rps_each"] = [round(s["rps"], 1) for s in samples]
            row["rps_hardened_vs_open"] = round(row["hardened_rps"] / row["open_rps"], 3)
            row["cpu_hardened_vs_open"] = round(
                row["hardened_cpu_s_per_1000"] / row["open_cpu_s_per_1000"], 3
            )
            print(orjson.dumps(row).decode(), flush=True)
            summary.append(row)
        (out / "bench_router_hardening.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    finally:
        for p in reversed(procs):
            p.stop()


if __name__ == "__main__":
    main()
