"""Flow control under saturation (issue 33): two `corral sim` engines of 4 slots behind `corral router
--api-keys-file`, fresh engines and router per phase, in each mode: `on` (--flow-control, slot shares
on, the default), `no-shares` (--no-flow-slot-shares: dispatch order only) and `off` (no flow control).

Phases (open loop, streaming, bounded by --seconds each):
  alone     the light tenant alone (its unloaded TTFT)
  flood     the light tenant beside a heavy one sending 10x its rate, ~2.5x what the fleet serves
  priority  tenants `high` (priority 10) and `low` (0), each ~0.75x the fleet, and `batch` (-1,
            sheddable) at ~0.25x: high's TTFT against low's, and who is shed first
The fleet's capacity is measured first (closed loop straight at the engines). Every request is
accounted for: answered 200, 429 (flow control's, with Retry-After), or lost (anything else).

    .venv/bin/python benchmarks/bench_flow.py [--seconds 15] [--workers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_router import Proc, free_port, spawn, wait_ready
from loadgen import JSON_HEADERS, Report, chat_body, exit_on_sigterm, run_closed_loop, run_open_loop

MODEL = "sim-model"
OUT = Path(__file__).resolve().parent / "out"
SLOTS = 4
SIM_ARGS = ["--max-num-seqs", str(SLOTS), "--itl-ms", "10", "--ttft-base-ms", "5", "--seed", "0"]
MAX_TOKENS = 24
TENANTS = {  # name -> (key, priority)
    "light": ("light-tenant-key-0123456789", 0),
    "heavy": ("heavy-tenant-key-0123456789", 0),
    "high": ("high-tenant-key-01234567890", 10),
    "low": ("low-tenant-key-012345678901", 0),
    "batch": ("batch-tenant-key-0123456789", -1),
}
FLOW_ARGS = [
    "--flow-control",
    "--flow-engine-max-in-flight", str(SLOTS),
    "--flow-max-queue-per-tenant", "32",
    "--flow-queue-ttl", "10",
]  # fmt: skip
# on: slot shares (the default); no-shares: dispatch order only (--no-flow-slot-shares); off: no flow control
MODES = {"on": FLOW_ARGS, "no-shares": [*FLOW_ARGS, "--no-flow-slot-shares"], "off": []}


def keys_file(directory: Path) -> Path:
    path = directory / "keys.yaml"
    entries = [f"- name: {name}\n  key: {key}\n  priority: {prio}\n" for name, (key, prio) in TENANTS.items()]
    path.write_text("".join(entries))
    os.chmod(path, 0o600)
    return path


@contextmanager
def fleet(log_dir: Path, keys: Path, mode: str, workers: int) -> Iterator[tuple[str, list[str]]]:
    procs: list[Proc] = []
    try:
        sims = []
        for i in range(2):
            port = free_port()
            argv = [sys.executable, "-m", "corral", "sim", "--port", str(port), *SIM_ARGS]
            sims.append(spawn(f"sim{i}", argv, f"http://127.0.0.1:{port}", None, log_dir))
        procs += sims
        for sim in sims:
            wait_ready(sim, "/v1/models")
        port = free_port()
        argv = [
            sys.executable, "-m", "corral", "router", "--port", str(port), "--workers", str(workers),
            "--policy", "least_request", "--api-keys-file", str(keys), "--log-level", "warning",
            "--max-in-flight", "0",
            *(arg for sim in sims for arg in ("--backend", sim.url)),
            *MODES[mode],
        ]  # fmt: skip
        router = spawn("router", argv, f"http://127.0.0.1:{port}", None, log_dir)
        procs.append(router)
        wait_ready(router, "/health")
        yield router.url, [s.url for s in sims]
    finally:
        for proc in procs:
            proc.stop()


def headers(tenant: str) -> dict[str, str]:
    return {**JSON_HEADERS, "Authorization": f"Bearer {TENANTS[tenant][0]}"}


def body(i: int) -> bytes:
    return chat_body(MODEL, True, MAX_TOKENS, i)


async def capacity(sims: list[str], seconds: float) -> float:
    report = await run_closed_loop(
        "capacity",
        [u + "/v1/chat/completions" for u in sims],
        lambda i: body(i),
        clients=2 * SLOTS,
        max_requests=100_000,
        max_seconds=seconds,
        stream=True,
    )
    return report.rps


async def load(router: str, rates: dict[str, float], seconds: float) -> dict[str, Report]:
    url = router + "/v1/chat/completions"
    runs = [
        run_open_loop(
            name, [url], body, rate, int(rate * seconds) + 1, seconds, stream=True, request_timeout=60.0,
            headers=headers(name),
        )
        for name, rate in rates.items()
    ]  # fmt: skip
    return dict(zip(rates, await asyncio.gather(*runs), strict=True))


def outcome(report: Report) -> dict[str, float]:
    n = len(report.samples)
    ok = len(report.ok)
    shed = sum(1 for s in report.samples if s.status == 429)
    return {
        "sent": n,
        "ok": ok,
        "429": shed,
        "lost": n - ok - shed,
        "ttft_p50_ms": report.ttft_ms(0.5),
        "ttft_p90_ms": report.ttft_ms(0.9),
        "served_per_s": ok / report.wall if report.wall else 0.0,
    }


def show(phase: str, mode: str, results: dict[str, Report]) -> dict[str, dict[str, float]]:
    rows = {}
    for tenant, report in results.items():
        row = outcome(report)
        rows[tenant] = row
        print(
            f"| {phase} | {mode} | {tenant} | {row['sent']} | {row['ok']} | {row['429']} | {row['lost']} | "
            f"{row['ttft_p50_ms']:.0f} | {row['ttft_p90_ms']:.0f} | {row['served_per_s']:.1f} |",
            flush=True,
        )
    return rows


async def fast_path_cost(calls: int, workers: int) -> float:
    """Microseconds of CPU one request spends in the flow gate when an engine has room (admit_now, then
    finished), in this process: real endpoints, a tenant, slot shares on; with `workers` > 1, as worker 1
    of that many (publishing its counts to the host's tables, reading its siblings')."""
    from corral.engine_state import EngineState
    from corral.router.edge.tenants import Tenant
    from corral.router.edge.tenants_file import TenantSpec
    from corral.router.flow.config import FlowConfig
    from corral.router.flow.gate import Admission, FlowGate
    from corral.router.flow.saturation import Saturation
    from corral.router.membership.endpoint import Endpoint
    from corral.router.routing.load_board import LoadBoard

    engines = [Endpoint(f"http://10.0.0.{i}:8000", frozenset({MODEL}), EngineState.READY) for i in range(2)]
    config = FlowConfig(engine_max_in_flight=64)
    host = None
    if workers > 1:
        from corral.router.flow.host_flows import HostFlows, HostFlowTables
        from corral.router.routing.worker_journal import WorkerJournals

        host = HostFlows(HostFlowTables(WorkerJournals(workers)), 1, config.share_window_seconds)
    gate = FlowGate(config, Saturation(config, LoadBoard()), lambda model: engines, host)
    tenant = Tenant(TenantSpec(name="light"))
    headers = {"Content-Type": "application/json", "Authorization": "Bearer x"}
    start = time.process_time()
    for _ in range(calls):
        got = gate.admit_now(MODEL, headers, tenant)  # what the proxy calls; it awaits only a wait
        assert isinstance(got, Admission)
        gate.finished(MODEL, got)
    return (time.process_time() - start) / calls * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=15.0, help="duration bound of each phase")
    parser.add_argument(
        "--workers", type=int, default=1, help="corral router --workers (with --fast-path: as one of N)"
    )
    parser.add_argument("--modes", default="on,no-shares,off", help="of " + ", ".join(MODES))
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument(
        "--fast-path",
        type=int,
        default=0,
        metavar="N",
        help="only measure the gate's cost per request when an engine has room, over N requests, in "
        "this process (no engines, no router)",
    )
    args = parser.parse_args()
    if args.fast_path:
        cost = await fast_path_cost(args.fast_path, args.workers)
        print(
            f"flow gate, an engine with room: {cost:.2f} us of CPU per request ({args.fast_path} requests, "
            f"as one of {args.workers} workers)"
        )
        return
    exit_on_sigterm()
    log_dir = Path(args.out) / "bench_flow"
    log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        keys = keys_file(Path(tmp))
        with fleet(log_dir, keys, "off", args.workers) as (_, sims):
            cap = await capacity(sims, min(args.seconds, 8.0))
        heavy, light = 2.5 * cap, 0.25 * cap
        print(
            f"fleet capacity {cap:.1f} req/s (2 engines x {SLOTS} slots, {MAX_TOKENS} tokens streamed); "
            f"light {light:.1f} req/s, heavy {heavy:.1f} req/s; router --workers {args.workers}"
        )
        print("| phase | flow | tenant | sent | 200 | 429 | lost | TTFT p50 ms | TTFT p90 ms | served/s |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        table: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
        for mode in args.modes.split(","):
            with fleet(log_dir, keys, mode, args.workers) as (router, _):
                table["alone", mode] = show("alone", mode, await load(router, {"light": light}, args.seconds))
            with fleet(log_dir, keys, mode, args.workers) as (router, _):
                rates = {"light": light, "heavy": heavy}
                table["flood", mode] = show("flood", mode, await load(router, rates, args.seconds))
            with fleet(log_dir, keys, mode, args.workers) as (router, _):
                rates = {"high": 0.75 * cap, "low": 0.75 * cap, "batch": 0.25 * cap}
                table["priority", mode] = show("priority", mode, await load(router, rates, args.seconds))
        print()
        for mode in args.modes.split(","):
            alone = table["alone", mode]["light"]["ttft_p90_ms"]
            flood = table["flood", mode]
            prio = table["priority", mode]
            lost = sum(r["lost"] for (_, m), rows in table.items() if m == mode for r in rows.values())
            print(
                f"flow {mode}: light TTFT p90 under flood / alone = "
                f"{flood['light']['ttft_p90_ms'] / alone:.2f}x (goal <= 1.5); heavy served "
                f"{flood['heavy']['served_per_s']:.1f}/s of {cap:.1f}; high/low TTFT p90 = "
                f"{prio['high']['ttft_p90_ms'] / prio['low']['ttft_p90_ms']:.2f}x (goal <= 0.5); 429s "
                f"batch {prio['batch']['429']:.0f}/{prio['batch']['sent']:.0f}, "
                f"low {prio['low']['429']:.0f}, high {prio['high']['429']:.0f}; lost {lost:.0f}"
            )


if __name__ == "__main__":
    asyncio.run(main())
