"""An engine's return with and without slow start, the same workload: TTFT p50/p99 in the window after a
fresh engine (empty prefix cache) is added to the router's backends file, and that engine's own TTFT.

Fleet: `corral sim` engines with a prefill cost per uncached token and a small prefix cache (as in
bench_prefix.py); `corral router --policy P --backends-file F --slow-start-seconds S`; Poisson arrivals
of streamed chats, each one of `--groups` long system prompts. Per variant (S = 0, then `--ramp`), fresh
processes: the router serves the old engines past their own ramp, then the new engine's line is written
and every request's TTFT is recorded until `--ramp` seconds after it became routable.

    .venv/bin/python benchmarks/bench_slow_start_return.py [--ramp 10] [--rate 40] [--policy prefix]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_router import ROOT, Proc, free_port, spawn, wait_ready
from loadgen import _quantile

MODEL = "bench-model"


def sim_argv(port: int, seed: int, args: argparse.Namespace) -> list[str]:
    return [
        *(sys.executable, "-m", "corral", "sim", "--host", "127.0.0.1", "--port", str(port)),
        *("--model", MODEL, "--seed", str(seed), "--max-num-seqs", str(args.max_num_seqs)),
        *("--kv-cache-blocks", str(args.kv_cache_blocks), "--block-size", "16"),
        *("--prefill-ms-per-token", str(args.prefill_ms_per_token), "--ttft-base-ms", "2"),
        *("--itl-ms", "2", "--max-model-len", "4096"),
    ]


async def one(s: aiohttp.ClientSession, url: str, body: bytes, out: list[tuple[float, float]]) -> None:
    """(wall clock at send, TTFT) of one streamed request that succeeded."""
    sent, start = time.time(), time.perf_counter()
    async with s.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        first = await resp.content.readany()
        ttft = time.perf_counter() - start
        await resp.read()
        if resp.status == 200 and first:
            out.append((sent, ttft))


async def fleet_entry(s: aiohttp.ClientSession, router: str, engine: str) -> dict[str, Any] | None:
    async with s.get(router + "/v1/fleet") as resp:
        body = orjson.loads(await resp.read())
    return next((e for e in body["endpoints"] if e["url"] == engine and e["routable"]), None)


async def run_variant(
    ramp: float, window: float, args: argparse.Namespace, out_dir: Path
) -> dict[str, float]:
    procs: list[Proc] = []
    try:
        sims = []
        for i in range(args.engines + 1):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            sims.append(spawn(f"ss-sim-{i}", sim_argv(port, i, args), url, None, out_dir))
        procs += sims
        for sim in sims:
            wait_ready(sim, "/health")
        backends = out_dir / "ss-backends"
        backends.write_text("\n".join(s.url for s in sims[:-1]) + "\n")
        port = free_port()
        argv = [sys.executable, "-m", "corral", "router", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--backends-file", str(backends), "--policy", args.policy, "--slow-start-seconds", str(ramp)]
        argv += ["--models-refresh-seconds", "0.3", "--workers", "1"]
        router = spawn(f"ss-router-{ramp}", argv, f"http://127.0.0.1:{port}", None, out_dir)
        procs.append(router)
        wait_ready(router, "/health")
        started = time.time()
        rng = random.Random(args.seed)
        systems = [
            f"Group {g}. " + " ".join(f"w{rng.randrange(5000)}" for _ in range(400)) for g in range(24)
        ]
        samples: list[tuple[float, float]] = []
        new = sims[-1].url
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            tasks: set[asyncio.Task[None]] = set()
            stop_at = time.time() + window + 1.5 + 30  # bounded whatever happens
            added: float | None = None
            since: float | None = None
            i = 0
            while time.time() < stop_at:
                i += 1
                body = {
                    "model": MODEL,
                    "messages": [
                        {"role": "system", "content": systems[rng.randrange(len(systems))]},
                        {"role": "user", "content": f"question {i}"},
                    ],
                    "max_tokens": 8,
                    "stream": True,
                }
                chat = router.url + "/v1/chat/completions"
                task = asyncio.create_task(one(s, chat, orjson.dumps(body), samples))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(rng.expovariate(args.rate))
                # the same warm phase for every variant: the old engines past a ramp of `window`
                if added is None and time.time() > started + window + 1.5:
                    backends.write_text("\n".join(x.url for x in sims) + "\n")
                    added = time.time()
                elif added is not None and since is None and i % 5 == 0:
                    entry = await fleet_entry(s, router.url, new)
                    if entry is not None:
                        since = entry["slow_start"]["since"] if entry["slow_start"] else time.time()
                        stop_at = since + window
            await asyncio.gather(*tasks, return_exceptions=True)
        assert since is not None, "the new engine never became routable"
        during = [t for sent, t in samples if since <= sent <= since + window]
        return {
            "requests": len(during),
            "ttft_p50_ms": round(_quantile(during, 0.5) * 1000, 1),
            "ttft_p99_ms": round(_quantile(during, 0.99) * 1000, 1),
        }
    finally:
        for p in procs:
            p.popen.terminate()
        for p in procs:
            p.popen.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--ramp", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--engines", type=int, default=2, help="serving before the new one")
    parser.add_argument("--policy", default="prefix")
    parser.add_argument("--kv-cache-blocks", type=int, default=400)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/out"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for ramp in (0.0, args.ramp):
        result = asyncio.run(run_variant(ramp, args.ramp, args, out))
        print(
            orjson.dumps({"policy": args.policy, "slow_start_seconds": ramp, **result}).decode(), flush=True
        )


if __name__ == "__main__":
    main()
