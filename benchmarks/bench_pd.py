"""Prefill/decode disaggregation benchmark: long prompts and long outputs, streamed, in one run over
(a) two aggregated simulators behind `corral router --policy least_request`, (b) one prefill and one
decode simulator (`--kv-transfer-config`, NIXL) behind `corral router --prefill URL --decode URL`, and
(c) the same two P/D simulators behind the Rust `vllm-router --vllm-pd-disaggregation` (when installed:
benchmarks/setup.sh). Same engine count, same latency model, same request shapes for every fleet.

Workload: `--clients` closed-loop clients; request i has a prompt of shared-nothing words drawn between
`--prompt-min` and `--prompt-max` (about one token a word) and asks for between `--out-min` and
`--out-max` tokens (the same shapes for every fleet; each fleet gets fresh text, so nothing is a prefix
cache hit). Each fleet runs `--rounds` measured phases of `--seconds` (and at most `--max-requests`),
letting its clients finish each; every other round goes through the fleets in reverse order, so none
always runs first. All routers stay up for the whole run; only the fleet being measured gets load.

Reported per fleet: TTFT and ITL p50/p99 (ITL over every gap between text events), TPOT p50, requests/s,
output tokens/s, failures, the router's CPU-seconds per 1000 requests, and from the engines' own
`/metrics` (deltas over the fleet's phases): requests, generated tokens per request, prompt tokens
computed vs transferred, NIXL transfer time; then the ratios P/D / aggregated and corral / vllm-router.
Where the simulator or the router lacks P/D, those fleets are skipped with a line saying why and the
aggregated fleet still runs.

What the simulator models decides what this can show. P/D wins where a long prefill on an aggregated
engine stalls the decodes running beside it; the run starts with an interference probe on one aggregated
engine (a decode stream's ITL alone and while long prefills arrive) that says whether the engines model
that coupling at all.

    .venv/bin/python benchmarks/bench_pd.py [--seconds 15] [--rounds 2] [--clients 16] [--markdown]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_router import ROOT, Proc, find_vllm_router, free_port, spawn, wait_ready
from corral.engine import metric_names as m
from corral.engine.metrics_text import samples
from pd_load import MODEL, Workload, closed_loop, interference_probe
from stream_timing import TimedReport

CORRAL = [sys.executable, "-m", "corral"]


ENGINE_SERIES = (
    m.FINISHED,
    m.PROMPT_TOKENS,
    m.GENERATION_TOKENS,
    m.PROMPT_TOKENS_BY_SOURCE,
    m.NIXL_XFER_TIME + "_sum",
    m.NIXL_XFER_TIME + "_count",
    m.NIXL_FAILED_TRANSFERS,
)


def engine_counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for s in samples(text, ENGINE_SERIES):
        key = s.name
        if s.name == m.PROMPT_TOKENS_BY_SOURCE:
            key = f"prompt_{s.labels.get('source', '')}"
        out[key] = out.get(key, 0.0) + s.value
    return out


def engine_row(d: dict[str, float]) -> dict[str, Any]:
    """An engine's counters over a fleet's measured phases (`d`: their deltas, summed over rounds)."""
    requests = d.get(m.FINISHED, 0.0)
    row: dict[str, Any] = {
        "requests": int(requests),
        "gen_tokens_per_request": round(d.get(m.GENERATION_TOKENS, 0.0) / requests, 1) if requests else None,
        "prompt_tokens": int(d.get(m.PROMPT_TOKENS, 0.0)),
    }
    for source in m.PROMPT_SOURCES:
        if f"prompt_{source}" in d:
            row[f"prompt_{source}"] = int(d[f"prompt_{source}"])
    count = d.get(m.NIXL_XFER_TIME + "_count", 0.0)
    if count:
        row["xfers"] = int(count)
        row["xfer_mean_ms"] = round(d[m.NIXL_XFER_TIME + "_sum"] / count * 1000, 1)
    if d.get(m.NIXL_FAILED_TRANSFERS):
        row["failed_xfers"] = int(d[m.NIXL_FAILED_TRANSFERS])
    return row


@dataclass
class Fleet:
    name: str
    engines: list[Proc]
    router: Proc


def start_router(name: str, argv: list[str], out: Path) -> Proc:
    """`argv` without host and port; `corral router` and `vllm-router` take both flags alike."""
    port = free_port()
    return spawn(f"pd-router-{name}", [*argv, "--host", "127.0.0.1", "--port", str(port)],
                 f"http://127.0.0.1:{port}", None, out)  # fmt: skip


def start_sims(names: list[str], base: list[str], extra: list[list[str]], out: Path) -> list[Proc]:
    sims = []
    for i, (name, more) in enumerate(zip(names, extra, strict=True)):
        port = free_port()
        argv = [*CORRAL, "sim", "--host", "127.0.0.1", "--port", str(port), "--seed", str(i), *base, *more]
        sims.append(spawn(name, argv, f"http://127.0.0.1:{port}", None, out))
    for sim in sims:
        wait_ready(sim, "/health")
    return sims


class Progress:
    """One stderr line per step of the run, with the seconds since it started."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[+{time.monotonic() - self.start:5.1f}s] {message}", file=sys.stderr, flush=True)


@dataclass
class FleetRun:
    """What a fleet's measured phases (one per round) add up to."""

    fleet: Fleet
    report: TimedReport
    engine_deltas: list[dict[str, float]]
    warmup_failures: dict[str, int]
    router_cpu: float = 0.0

    @classmethod
    def of(cls, fleet: Fleet) -> FleetRun:
        return cls(fleet, TimedReport(fleet.name), [{} for _ in fleet.engines], {})

    def row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"fleet": self.fleet.name, **self.report.summary()}
        ok = len(self.report.ok)
        row["router_cpu_s_per_1000"] = round(self.router_cpu / ok * 1000, 2) if ok else None
        if self.report.failures() or self.warmup_failures:
            row["failures"] = self.report.failures()
            row["warmup_failures"] = self.warmup_failures
        row["engines"] = {
            e.name: engine_row(d) for e, d in zip(self.fleet.engines, self.engine_deltas, strict=True)
        }
        return row


def run_fleet(
    run: FleetRun, work: Workload, salt: int, args: argparse.Namespace, out: Path, say: Progress
) -> None:
    """One measured phase of `run`'s fleet, added to `run`."""
    fleet, router = run.fleet, run.fleet.router
    url = router.url + "/v1/chat/completions"
    say(f"{fleet.name}: warming up")
    warm = uvloop.run(closed_loop("warmup", url, work, salt + 50, 2, 4, 30.0, max_tokens=8))
    before = [engine_counters(e.url) for e in fleet.engines]
    cpu = router.cpu_seconds()
    say(f"{fleet.name}: measuring for {args.seconds:g}s with {args.clients} clients")
    report = uvloop.run(
        closed_loop(fleet.name, url, work, salt, args.clients, args.max_requests, args.seconds)
    )
    run.router_cpu += router.cpu_seconds() - cpu
    after = [engine_counters(e.url) for e in fleet.engines]
    say(f"{fleet.name}: {len(report.samples)} requests in {report.wall:.1f}s")
    run.report.samples += report.samples
    run.report.wall += report.wall
    for k, v in warm.failures().items():
        run.warmup_failures[k] = run.warmup_failures.get(k, 0) + v
    for total, b, a in zip(run.engine_deltas, before, after, strict=True):
        for key, value in a.items():
            total[key] = total.get(key, 0.0) + value - b.get(key, 0.0)


RATIO_KEYS = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "out_tok_s")


def ratios(num: dict[str, Any], den: dict[str, Any]) -> dict[str, float | None]:
    return {k: (round(num[k] / den[k], 3) if den.get(k) else None) for k in RATIO_KEYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="bound of each measured phase")
    parser.add_argument("--max-requests", type=int, default=1000, help="per fleet")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--rounds", type=int, default=2, help="measured phases per fleet, every other round in reverse order"
    )
    parser.add_argument("--prompt-min", type=int, default=2000, help="prompt words (about tokens)")
    parser.add_argument("--prompt-max", type=int, default=8000)
    parser.add_argument("--out-min", type=int, default=256, help="output tokens")
    parser.add_argument("--out-max", type=int, default=512)
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.1)
    parser.add_argument("--ttft-base-ms", type=float, default=5.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--kv-cache-blocks", type=int, default=16384, help="per engine, 16-token blocks")
    parser.add_argument(
        "--kv-role", default="kv_both", help="kv_role of both P/D engines (vLLM's NIXL docs use kv_both)"
    )
    parser.add_argument(
        "--pd-sim-args", default="", help="extra flags for the two P/D simulators only, shell-split"
    )
    parser.add_argument("--policy", default="least_request", help="corral router's policy, every fleet")
    parser.add_argument(
        "--only", default="", help="comma-separated fleets: aggregated, pd-corral, pd-vllm-router"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--vllm-router", default=None)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/out"))
    args = parser.parse_args()
    say = Progress()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = {f.strip() for f in args.only.split(",") if f.strip()}
    work = Workload(args)

    base = [
        "--model", MODEL, "--max-model-len", str(args.prompt_max * 2 + args.out_max + 64),
        "--max-num-seqs", str(args.max_num_seqs), "--kv-cache-blocks", str(args.kv_cache_blocks),
        "--block-size", "16", "--prefill-ms-per-token", str(args.prefill_ms_per_token),
        "--ttft-base-ms", str(args.ttft_base_ms), "--itl-ms", str(args.itl_ms),
    ]  # fmt: skip
    skipped: list[str] = []
    # A checkout from before P/D (to price a change against its parent) lacks these modules.
    sim_pd = importlib.util.find_spec("corral.sim.core.kv_transfer") is not None
    router_pd = importlib.util.find_spec("corral.router.datapath.pd") is not None
    vr = find_vllm_router(args.vllm_router)
    if not sim_pd:
        skipped.append("P/D fleets: `corral sim` has no --kv-transfer-config")
    elif not router_pd:
        skipped.append("pd-corral: `corral router` has no --prefill/--decode")
    if sim_pd and not vr:
        skipped.append("pd-vllm-router: vllm-router not found (benchmarks/setup.sh installs it)")

    procs: list[Proc] = []
    results: list[dict[str, Any]] = []
    probe: dict[str, Any] | None = None
    try:
        fleets: list[Fleet] = []
        say("starting simulators")
        if not only or "aggregated" in only:
            agg = start_sims(["pd-agg-sim-0", "pd-agg-sim-1"], base, [[], []], out)
            procs += agg
            argv = [*CORRAL, "router", "--workers", "1", "--policy", args.policy, "--log-level", "warning"]
            for s in agg:
                argv += ["--backend", s.url]
            fleets.append(Fleet("aggregated", agg, start_router("aggregated", argv, out)))
        want_pd = [f for f in ("pd-corral", "pd-vllm-router") if not only or f in only]
        if sim_pd and want_pd and (router_pd or vr):
            config = json.dumps({"kv_connector": "NixlConnector", "kv_role": args.kv_role})
            pd_flags = ["--kv-transfer-config", config, *shlex.split(args.pd_sim_args)]
            prefill, decode = start_sims(["pd-prefill-sim", "pd-decode-sim"], base, [pd_flags, pd_flags], out)
            procs += [prefill, decode]
            if router_pd and "pd-corral" in want_pd:
                argv = [*CORRAL, "router", "--policy", args.policy, "--log-level", "warning"]
                argv += ["--workers", "1", "--prefill", prefill.url, "--decode", decode.url]
                fleets.append(Fleet("pd-corral", [prefill, decode], start_router("pd-corral", argv, out)))
            if vr and "pd-vllm-router" in want_pd:
                argv = [vr, "--vllm-pd-disaggregation", "--prefill", prefill.url, "--decode", decode.url]
                argv += ["--policy", "round_robin", "--log-level", "warning"]
                argv += ["--prometheus-port", str(free_port())]
                router = start_router("pd-vllm-router", argv, out)
                fleets.append(Fleet("pd-vllm-router", [prefill, decode], router))
        procs += [f.router for f in fleets]
        for f in fleets:
            wait_ready(f.router, "/v1/models" if f.name == "pd-vllm-router" else "/health")
        say("routers ready")
        time.sleep(1.0)  # corral routers' first metrics scrape and model probe
        for line in skipped:
            print(f"skipped {line}", file=sys.stderr)
        if fleets and fleets[0].name == "aggregated":
            say("interference probe on one aggregated engine")
            chat = fleets[0].engines[0].url + "/v1/chat/completions"
            probe = uvloop.run(interference_probe(chat, args.prompt_max, 4))
            print(f"interference probe: {orjson.dumps(probe).decode()}", flush=True)
        runs = [FleetRun.of(f) for f in fleets]
        for r in range(args.rounds):  # every other round in reverse order: no fleet always runs first
            for k, run in list(enumerate(runs)) if r % 2 == 0 else list(enumerate(runs))[::-1]:
                run_fleet(run, work, 1000 * r + 100 * (k + 1), args, out, say)
        for run in runs:
            results.append(run.row())
            print(orjson.dumps(results[-1]).decode(), flush=True)
    finally:
        for p in reversed(procs):
            p.stop()

    by = {r["fleet"]: r for r in results}
    comparisons: dict[str, dict[str, float | None]] = {}
    for num, den in (("pd-corral", "aggregated"), ("pd-corral", "pd-vllm-router")):
        if num in by and den in by:
            comparisons[f"{num} / {den}"] = ratios(by[num], by[den])
            print(f"{num} / {den}: {orjson.dumps(comparisons[f'{num} / {den}']).decode()}")
    report = {
        "command": " ".join(sys.argv),
        "interference_probe": probe,
        "results": results,
        "ratios": comparisons,
        "skipped": skipped,
    }
    (out / "bench_pd.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    if args.markdown:
        print(markdown(results, comparisons))
        if probe:
            print(f"\nInterference probe (one aggregated engine, decode ITL alone / with prefills): {probe}")


def markdown(results: list[dict[str, Any]], comparisons: dict[str, dict[str, float | None]]) -> str:
    cols = ["fleet", "requests", "failed", "rps", "out_tok_s", "ttft_p50_ms", "ttft_p99_ms",
            "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms", "router_cpu_s_per_1000"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in results:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    if comparisons:
        lines += ["", "| ratio | " + " | ".join(RATIO_KEYS) + " |", "|" + "---|" * (len(RATIO_KEYS) + 1)]
        for name, values in comparisons.items():
            lines.append(f"| {name} | " + " | ".join(str(values[k]) for k in RATIO_KEYS) + " |")
    head = "| fleet | engine | requests | gen tokens/request | prompt tokens | by source | xfer mean ms |"
    lines += ["", head, "|---|---|---|---|---|---|---|"]
    for r in results:
        for name, e in r["engines"].items():
            sources = {k[7:]: v for k, v in e.items() if k.startswith("prompt_") and k != "prompt_tokens"}
            lines.append(
                f"| {r['fleet']} | {name} | {e['requests']} | {e['gen_tokens_per_request']} | "
                f"{e['prompt_tokens']} | {sources or ''} | {e.get('xfer_mean_ms', '')} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
