"""CLI start-up benchmark: how long each `corral` command takes from process start to exit for `--help`
(and `corral --version`), best and median of N runs, with the CPU the process used, and what the import
of each command's module costs (`python -X importtime`, cumulative seconds of the module). `--baseline-src
DIR` runs the same commands from another checkout's `src/` (e.g. `git archive HEAD~5 src | tar -x -C
/tmp/before`), alternating with this checkout's run by run, to price a change against its parent in the
same run on the same load. The target: every command under 0.3 s.

    .venv/bin/python benchmarks/bench_cli_startup.py [--runs 15] [--baseline-src /tmp/before/src]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_SECONDS = 0.3
# each command, and the module its `--help` imports (the subcommand's own, or the group's)
COMMANDS: dict[tuple[str, ...], str] = {
    ("--version",): "corral.cli",
    ("--help",): "corral.cli",
    ("status", "--help"): "corral.fleet.checks.status_cli",
    ("up", "--help"): "corral.fleet.local.up",
    ("router", "--help"): "corral.router.cli",
    ("k8s", "render", "--help"): "corral.k8s.render.cli",
    ("sleep", "--help"): "corral.supervisor.commands.runbook_ops",
    ("doctor", "--help"): "corral.fleet.checks.doctor_cli",
    ("verify", "--help"): "corral.fleet.checks.verify_cli",
    ("logs", "--help"): "corral.fleet.local.logs",
    ("rollout", "--help"): "corral.fleet.rollout.cli",
    ("supervise", "run", "--help"): "corral.supervisor.cli",
    ("sim", "--help"): "corral.sim.cli",
}


def _env(src: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(args: tuple[str, ...], src: Path | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `python -m corral ARGS`."""
    cpu = _children_cpu()
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "corral", *args], env=_env(src), check=True, stdout=subprocess.DEVNULL
    )
    return time.perf_counter() - started, _children_cpu() - cpu


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


def _line(label: str, walls: list[float], cpus: list[float], imported: float) -> str:
    median = statistics.median(walls)
    over = "  OVER" if median >= TARGET_SECONDS else ""
    return (
        f"    {label:<9} best {min(walls):.3f}s  median {median:.3f}s  CPU median "
        f"{statistics.median(cpus):.3f}s  import {imported:.3f}s{over}"
    )


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--baseline-src", type=Path, default=None, help="Another checkout's src/ directory.")
    options = parser.parse_args()
    here = Path(__file__).resolve().parents[1] / "src"
    sources: dict[str, Path] = {"this": here}
    if options.baseline_src is not None:
        sources["baseline"] = options.baseline_src
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    bare = []
    for _ in range(options.runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - started)
    print(f"  a bare interpreter: best {min(bare):.3f}s  median {statistics.median(bare):.3f}s")
    print(f"  {options.runs} runs each, checkouts alternating run by run; target: under {TARGET_SECONDS} s")
    for args, module in COMMANDS.items():
        walls: dict[str, list[float]] = {name: [] for name in sources}
        cpus: dict[str, list[float]] = {name: [] for name in sources}
        for _ in range(options.runs):
            for name, src in sources.items():
                wall, cpu = one_run(args, src)
                walls[name].append(wall)
                cpus[name].append(cpu)
        print(f"  corral {' '.join(args)}")
        for name, src in sources.items():
            print(_line(name, walls[name], cpus[name], import_seconds(module, src)))
        if "baseline" in sources:
            ratio = statistics.median(walls["baseline"]) / statistics.median(walls["this"])
            print(f"    baseline / this (median wall): {ratio:.1f}x")


if __name__ == "__main__":
    main()
