"""PRECHECK cost (not a test): what authorizing a start adds before every launch, against what every
READY already paid before issue 14 — fingerprinting the bundle (`bundle_from`, which hashes the model
files the same way) — measured in the same run.

Cases: a `corral sim` with a bare model name (what `corral up` and most tests start: no files, no
subprocess), and a sparse 30 GiB checkpoint in 3 shards on a simulated 80 GiB device, TP 1 and TP 2.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_precheck.py [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.model_dirs import GIB, make_model_dir

from corral.supervisor.checks.bundle import bundle_from
from corral.supervisor.precheck.gate import PrecheckSettings, run_precheck


def _median_ms(run: Callable[[], object], runs: int) -> float:
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        took.append((time.perf_counter() - t0) * 1000)
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    env = dict(os.environ)
    settings = PrecheckSettings()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model_dir(Path(tmp) / "m30", weights_bytes=30 * GIB, shards=3)
        on_80 = ("corral", "sim", "--model", str(model), "--gpu-memory-gib", "80")
        cases = {
            "sim, bare name": ("corral", "sim", "--model", "sim-model"),
            "30 GiB dir, TP 1": on_80,
            "30 GiB dir, TP 2": (*on_80, "-tp", "2"),
        }
        models = [{"id": "sim-model"}]
        loop_only = _median_ms(lambda: asyncio.run(asyncio.sleep(0)), args.runs)
        print(f"an event loop alone (asyncio.run of nothing): {loop_only:.2f} ms, included in 'precheck ms'")
        print(f"{'case':<20} {'precheck ms':>12} {'fingerprint ms':>15} {'ratio':>7}  outcome")
        for name, argv in cases.items():
            report = asyncio.run(run_precheck(argv, env, settings))
            precheck = _median_ms(lambda a=argv: asyncio.run(run_precheck(a, env, settings)), args.runs)
            fingerprint = _median_ms(lambda a=argv: bundle_from(a, "0.33.0", models), args.runs)
            outcome = "authorized" if report.authorized else "refused"
            ratio = precheck / fingerprint
            print(f"{name:<20} {precheck:>12.2f} {fingerprint:>15.2f} {ratio:>7.2f}  {outcome}")


if __name__ == "__main__":
    main()
