"""What the admission gate costs the traffic of a local fleet: `corral up` (each engine behind its
supervisor's gate, the default) against `corral up --no-gate` (the router straight to the engines),
in the same run.

Setup: per round and variant, a fresh `corral up --engines N` (XDG_STATE_HOME in a temporary
directory), then one closed-loop load through the router (`--clients` workers, each sending its next
chat completion when the last one ends, alternately streamed and non-streamed, `--max-tokens` tokens
each): a warmup, then `--seconds` measured. The variants alternate (no-gate, gate, no-gate, gate, …)
so that a machine that gets busier during the run weighs on both. Per variant, the median over the
rounds of: requests/s, TTFT p50/p99 of the streamed requests (to the first SSE event), latency
p50/p99 of the non-streamed ones, and failures (there should be none); then gate / no-gate ratios.

Loopback only; bounded in count and time; every fleet is stopped at the end of its round (SIGINT to
`corral up`, a wait, then SIGKILL to whatever of it is left). The result is also written to
benchmarks/out/bench_gate.json.
    .venv/bin/python benchmarks/bench_gate.py [--rounds 2] [--seconds 10] [--clients 16] [--engines 2]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rollout import Child, Load, free_port, wait_router_url

VARIANTS = {"no-gate": ["--no-gate"], "gate": []}
KEYS = ("rps", "ttft_p50_ms", "ttft_p99_ms", "latency_p50_ms", "latency_p99_ms")


async def _load(args: argparse.Namespace, url: str) -> dict[str, Any]:
    bound = args.warmup_seconds + args.seconds + 30
    load = Load(url, args.clients, args.max_tokens, args.max_requests, bound)
    task = asyncio.create_task(load.run())
    await asyncio.sleep(args.warmup_seconds)
    load.enter("measure")
    await asyncio.sleep(args.seconds)
    load.finish()
    await task
    stats = load.stats("measure")
    stats["failures"] = [f"{s.kind}: {s.detail}" for s in load.samples if s.kind != "completed"][:10]
    return stats


def run_round(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-gate-{variant}-"))
    env = {"XDG_STATE_HOME": str(work / "state")}
    up_args = ["up", "--engines", str(args.engines), "--port", str(free_port()), *VARIANTS[variant]]
    up_args += [f"--sim-arg={a}" for a in args.sim_arg]
    up = Child.start("up", up_args, env, work)
    try:
        url = wait_router_url(up, 120)
        stats = asyncio.run(_load(args, url))
    finally:
        print(up.stop(signal.SIGINT, 60), flush=True)
    print(orjson.dumps({"variant": variant, **stats}).decode(), flush=True)
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="fleets per variant, alternating")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--warmup-seconds", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per fleet")
    parser.add_argument("--max-requests", type=int, default=200_000, help="bound on each fleet's requests")
    parser.add_argument(
        "--sim-arg", action="append", default=[], help="extra `corral sim` argument (repeatable)"
    )
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    args = parser.parse_args()

    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            runs[variant].append(run_round(args, variant))
    medians = {v: {k: statistics.median(r[k] for r in rs) for k in KEYS} for v, rs in runs.items()}
    ratios = {k: round(medians["gate"][k] / medians["no-gate"][k], 3) for k in KEYS if medians["no-gate"][k]}
    failures = {v: sum(len(r["failures"]) for r in rs) for v, rs in runs.items()}
    result = {"settings": vars(args), "runs": runs, "medians": medians, "gate_vs_no_gate": ratios}
    print("| variant | req/s | TTFT p50 ms | TTFT p99 ms | latency p50 ms | latency p99 ms | failures |")
    print("|---|---|---|---|---|---|---|")
    for variant, m in medians.items():
        cells = [variant, *(f"{m[k]:g}" for k in KEYS), str(failures[variant])]
        print("| " + " | ".join(cells) + " |")
    print(f"gate / no-gate (medians of {args.rounds} rounds): {ratios}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_gate.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    raise SystemExit(1 if any(failures.values()) else 0)


if __name__ == "__main__":
    main()
