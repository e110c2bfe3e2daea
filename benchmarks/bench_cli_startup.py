"""CLI start-up benchmark: how long `corral --help`, `corral status --help` and `corral sleep --help` take
from process start to exit (best and median of N runs), and what the import of each command costs
(`python -X importtime`, cumulative microseconds of its module). `--baseline-src DIR` runs the same
commands from another checkout's `src/` (e.g. `git archive HEAD~5 src | tar -x -C /tmp/before`), to
price a change against its parent in the same run. The target: under 0.3 s for the first two.

    .venv/bin/python benchmarks/bench_cli_startup.py [--runs 15] [--baseline-src /tmp/before/src]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = (("--help",), ("status", "--help"), ("sleep", "--help"))
MODULES = {
    "--help": "corral.cli",
    "status --help": "corral.fleet.checks.status_cli",
    "sleep --help": "corral.supervisor.commands.runbook_ops",
}


def _env(src: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    return env


def wall_times(args: tuple[str, ...], runs: int, src: Path | None) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "corral", *args], env=_env(src), check=True, stdout=subprocess.DEVNULL
        )
        times.append(time.perf_counter() - started)
    return times


def import_seconds(module: str, src: Path | None) -> float:
    """The cumulative import time `python -X importtime` reports for `module` (the whole tree it pulls)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        env=_env(src),
        check=True,
        capture_output=True,
        text=True,
    )
    for line in done.stderr.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1]) / 1e6
    return float("nan")


def report(label: str, runs: int, src: Path | None) -> None:
    print(f"{label}: best / median wall time of {runs} runs, and the command module's import time")
    for args in COMMANDS:
        name = " ".join(args)
        times = wall_times(args, runs, src)
        module = MODULES[name]
        print(
            f"  corral {name:<14} best {min(times):.3f}s  median {statistics.median(times):.3f}s  "
            f"import {module} {import_seconds(module, src):.3f}s"
        )


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--baseline-src", type=Path, default=None, help="Another checkout's src/ directory.")
    options = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    bare = []
    for _ in range(options.runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - started)
    print(f"  a bare interpreter: best {min(bare):.3f}s  median {statistics.median(bare):.3f}s")
    report("this checkout", options.runs, Path(__file__).resolve().parents[1] / "src")
    if options.baseline_src is not None:
        report(f"baseline {options.baseline_src}", options.runs, options.baseline_src)


if __name__ == "__main__":
    main()
