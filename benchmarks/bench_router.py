"""Router data-path benchmark: the same workloads, in one run, over the same two simulators, sent
(1) straight to the simulators (the direct path, the baseline), (2) through `corral router` (with
`--limits both`, also through one with every client limit off, to price the limits; `--tenants N`
adds an API-keys file of N tenants to the limited one, so it prices limits and tenants together;
`--baseline-src DIR` adds the same router imported from another checkout's `src/`, to price a change
against its parent in the same run), and (3) through the Rust `vllm-router` from PyPI when it is
installed (`benchmarks/setup.sh`).

Workloads:
  overhead    open loop at a fixed rate (default 200 req/s), non-streaming: added p50/p99 latency
  throughput  closed loop, 64 clients, zero think time, non-streaming and streaming:
              requests/s, p50/p99, TTFT, and each router's CPU-seconds per 1000 requests

Everything runs on loopback and stops by itself (bounded count and time per workload).
    .venv/bin/python benchmarks/bench_router.py [--seconds 15] [--pin] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil
import uvloop
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corral.fleet.local import ports
from loadgen import JSON_HEADERS, Report, chat_body, run_closed_loop, run_open_loop

ROOT = Path(__file__).resolve().parent.parent
MODEL = "bench-model"
# `corral router` with every client limit off (corral.router.edge.client_limits): the unhardened data path.
LIMITS_OFF = [
    "--header-timeout", "0",
    "--body-timeout", "0",
    "--idle-timeout", "0",
    "--max-connections", "0",
    "--max-in-flight", "0",
    "--max-body-size", "0",
]  # fmt: skip


def free_port() -> int:
    return ports.free_port("127.0.0.1")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str

    def cpu_seconds(self) -> float:
        """User+system CPU of the process and all its descendants so far."""
        try:
            root = psutil.Process(self.popen.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0.0
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)


def spawn(
    name: str,
    argv: list[str],
    url: str,
    cpus: set[int] | None,
    log_dir: Path,
    env: dict[str, str] | None = None,
) -> Proc:
    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    log = (log_dir / f"{name}.log").open("wb")
    popen = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=pin,
        env=env,
    )
    return Proc(name, popen, url)


def wait_ready(proc: Proc, path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise SystemExit(f"{proc.name} exited with {proc.popen.returncode}")
        try:
            with urllib.request.urlopen(proc.url + path, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{proc.name} not ready at {proc.url}{path} after {timeout}s")


OWN_TARGETS = ("corral", "corral-lean", "corral-traced")  # the targets --corral-args applies to

# `--traced`: an OTLP/HTTP JSON receiver that answers 200 and counts the spans it was sent (GET /count)
SPAN_SINK = """
import sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
count, lock = [0], threading.Lock()
class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with lock:
            count[0] += body.count(b'"spanId"')
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"{}")
    def do_GET(self):
        payload = str(count[0]).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(payload))); self.end_headers()
        self.wfile.write(payload)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
"""


def router_has_workers_flag() -> bool:
    """Whether this checkout's `corral router` takes --workers (older ones serve one process only)."""
    help_text = subprocess.run(
        [sys.executable, "-m", "corral", "router", "--help"], capture_output=True, text=True, check=False
    ).stdout
    return "--workers" in help_text


def find_vllm_router(explicit: str | None) -> str | None:
    for candidate in (explicit, str(ROOT / ".bench-venv/bin/vllm-router"), shutil.which("vllm-router")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


@dataclass
class Target:
    name: str
    urls: list[str]
    proc: Proc | None  # the router process whose CPU is measured; None for the direct path
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON_HEADERS))


# Simulators fast enough that the router, not the engine, is what a benchmark measures.
FAST_SIM_ARGS = [
    "--max-num-seqs",
    "512",
    "--ttft-base-ms",
    "1",
    "--itl-ms",
    "1",
    "--prefill-ms-per-token",
    "0",
]


def start_fast_sims(count: int, cpus: set[int] | None, out: Path, prefix: str = "sim") -> list[Proc]:
    """`count` simulators of MODEL on free loopback ports (seeds 0..count-1), each answering /health."""
    sims = []
    for i in range(count):
        port = free_port()
        argv = [sys.executable, "-m", "corral", "sim", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--model", MODEL, "--seed", str(i), *FAST_SIM_ARGS]
        sims.append(spawn(f"{prefix}-{i}", argv, f"http://127.0.0.1:{port}", cpus, out))
    try:
        for sim in sims:
            wait_ready(sim, "/health")
    except BaseException:
        for sim in sims:
            sim.stop()
        raise
    return sims


def write_tenants(out: Path, count: int) -> tuple[Path, str]:
    """A keys file of `count` tenants whose limits never refuse a benchmark's load; returns it and the key
    the load sends (the last tenant's, so a lookup is no luckier than any other)."""
    import secrets

    entries = [
        {
            "name": f"tenant-{i}",
            "key": secrets.token_hex(24),
            "max_in_flight": 100_000,
            "requests_per_minute": 100_000_000,
            "models": [MODEL],
        }
        for i in range(count)
    ]
    path = out / "bench-tenants.yaml"
    path.write_text(yaml.safe_dump(entries))
    path.chmod(0o600)
    return path, str(entries[-1]["key"])


def run_workload(target: Target, label: str, runner: Callable[[], Any]) -> tuple[Report, float]:
    cpu_before = target.proc.cpu_seconds() if target.proc else 0.0
    report: Report = uvloop.run(runner())
    cpu = (target.proc.cpu_seconds() - cpu_before) if target.proc else 0.0
    report.name = f"{label} / {target.name}"
    return report, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="duration bound of each workload")
    parser.add_argument("--rate", type=float, default=200.0, help="open-loop rate for the overhead workload")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--vllm-router", default=None, help="path to the vllm-router console script")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every workload this many rounds, the routers' order reversed every other round, and "
        "print each ratio's median and range over the rounds (a single round's CPU ratio carries a few "
        "percent of noise: measure it with --baseline-src of the same commit)",
    )
    parser.add_argument("--corral-policy", default="round_robin")
    parser.add_argument(
        "--corral-args",
        default="",
        help="extra flags for the `corral` target only (not corral-baseline), shell-split, e.g. "
        "'--slow-start-seconds 60' to price a flag against the parent that lacks it",
    )
    parser.add_argument(
        "--pin", action="store_true", help="pin the router under test to CPU 1 and everything else to CPU 0"
    )
    parser.add_argument(
        "--limits",
        choices=["on", "off", "both"],
        default="on",
        help="corral router's client limits: on (the defaults, as shipped), off (every limit 0: the "
        "unhardened data path), or both, as two targets in the same run (corral-nolimits, corral)",
    )
    parser.add_argument(
        "--tenants",
        type=int,
        default=0,
        help="also give the `corral` target (limits on) an --api-keys-file of this many tenants, each with "
        "max_in_flight and requests_per_minute set high enough never to refuse; the load sends one "
        "tenant's key (the `corral-nolimits` target stays open: no limits, no tenants)",
    )
    parser.add_argument(
        "--baseline-src",
        default=None,
        help="also run a `corral-baseline` target: the same router (limits on) imported from this "
        "`src/` directory of another checkout (e.g. a `git worktree` of an older commit), so a change is "
        "priced against its parent in the same run",
    )
    parser.add_argument(
        "--system-chars",
        type=int,
        default=0,
        help="give each request a system prompt of this many characters, one of 16 groups (request i "
        "is group i %% 16), so the prefix policy keys, scores and remembers every request",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="`corral router --workers` for the `corral` target (1: the single process, compared with "
        "the Rust router on the same pinned core); ignored by a router without the flag",
    )
    parser.add_argument(
        "--lean-prototype",
        action="store_true",
        help="also run `lean-prototype` (benchmarks/lean_server_prototype.py): the proxy path on an "
        "httptools server protocol with no edge, the floor a server swap could reach",
    )
    parser.add_argument(
        "--http-server",
        choices=["default", "aiohttp", "lean", "both"],
        default="default",
        help="`corral router --http-server` of the `corral` target (default: the router's own default); "
        "both: `corral` on aiohttp and `corral-lean` on the lean server, as two targets in the same run",
    )
    parser.add_argument(
        "--traced",
        action="store_true",
        help="also run `corral-traced`: the `corral` target exporting a span per request "
        "(--otlp-traces-endpoint) to a receiver process on the load's CPU that answers 200 and counts spans",
    )
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/out"))
    args = parser.parse_args()
    if not 1 <= args.rounds <= 100:
        parser.error(f"--rounds {args.rounds}: give 1 to 100")

    def request_body(stream: bool, i: int) -> bytes:
        if args.system_chars <= 0:
            return chat_body(MODEL, stream, args.max_tokens, i)
        body = orjson.loads(chat_body(MODEL, stream, args.max_tokens, i))
        system = (f"Group {i % 16}: you answer questions about the sea. " * 200)[: args.system_chars]
        body["messages"].insert(0, {"role": "system", "content": system})
        return orjson.dumps(body)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    router_cpus = {1} if args.pin else None
    other_cpus = {0} if args.pin else None
    if other_cpus:
        os.sched_setaffinity(0, other_cpus)

    sims: list[Proc] = []
    procs: list[Proc] = []
    try:
        sims = start_fast_sims(2, other_cpus, out)
        procs += sims

        targets = [Target("direct", [s.url for s in sims], None)]
        variants = {"on": [("corral", [])], "off": [("corral-nolimits", LIMITS_OFF)]}
        variants["both"] = variants["off"] + variants["on"]
        tenant_headers = dict(JSON_HEADERS)
        if args.tenants:
            keys_file, tenant_key = write_tenants(out, args.tenants)
            variants["on"] = [("corral", ["--api-keys-file", str(keys_file)])]
            variants["both"] = variants["off"] + variants["on"]
            tenant_headers["Authorization"] = f"Bearer {tenant_key}"
        chosen = list(variants[args.limits])
        worker_flags = ["--workers", str(args.workers)] if router_has_workers_flag() else []
        server_flags: dict[str, list[str]] = {}
        if args.http_server in ("aiohttp", "lean"):
            server_flags["corral"] = ["--http-server", args.http_server]
        elif args.http_server == "both":
            server_flags = {"corral": ["--http-server", "aiohttp"], "corral-lean": ["--http-server", "lean"]}
            chosen.append(("corral-lean", variants["on"][-1][1]))
        if args.baseline_src:
            chosen.append(("corral-baseline", variants["on"][-1][1]))
        sink: Proc | None = None
        if args.traced:
            sink_port = free_port()
            sink_argv = [sys.executable, "-c", SPAN_SINK, str(sink_port)]
            sink = spawn("span-sink", sink_argv, f"http://127.0.0.1:{sink_port}", other_cpus, out)
            procs.append(sink)
            wait_ready(sink, "/count")
            chosen.append(("corral-traced", [*variants["on"][-1][1], "--otlp-traces-endpoint", sink.url]))
        for name, limit_flags in chosen:
            port = free_port()
            argv = [
                sys.executable,
                "-m",
                "corral",
                "router",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--policy",
                args.corral_policy,
                *limit_flags,
                *(shlex.split(args.corral_args) if name in OWN_TARGETS else ()),
                *server_flags.get(name, []),
                *(worker_flags if name != "corral-baseline" else []),
                *(server_flags.get("corral", []) if name == "corral-traced" else []),
            ]
            for s in sims:
                argv += ["--backend", s.url]
            env = None
            if name == "corral-baseline":
                env = {**os.environ, "PYTHONPATH": str(Path(args.baseline_src).resolve())}
            corral = spawn(f"{name}-router", argv, f"http://127.0.0.1:{port}", router_cpus, out, env)
            procs.append(corral)
            wait_ready(corral, "/health")
            headers = (
                tenant_headers
                if name in ("corral", "corral-lean", "corral-baseline", "corral-traced")
                else dict(JSON_HEADERS)
            )
            targets.append(Target(name, [corral.url], corral, headers))

        if args.lean_prototype:
            port = free_port()
            argv = [sys.executable, str(ROOT / "benchmarks/lean_server_prototype.py"), "--port", str(port)]
            for s in sims:
                argv += ["--backend", s.url]
            lean = spawn("lean-prototype", argv, f"http://127.0.0.1:{port}", router_cpus, out)
            procs.append(lean)
            wait_ready(lean, "/health")
            targets.append(Target("lean-prototype", [lean.url], lean))

        vr = find_vllm_router(args.vllm_router)
        if vr:
            port = free_port()
            argv = [
                vr,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--policy",
                "round_robin",
                "--worker-urls",
                *[s.url for s in sims],
            ]
            rust = spawn("vllm-router", argv, f"http://127.0.0.1:{port}", router_cpus, out)
            procs.append(rust)
            wait_ready(rust, "/v1/models")
            targets.append(Target("vllm-router", [rust.url], rust))
        else:
            print("vllm-router not found: run benchmarks/setup.sh to compare against it", file=sys.stderr)

        results: list[dict[str, Any]] = []
        max_req = 1_000_000

        def chat_urls(t: Target) -> list[str]:
            return [u + "/v1/chat/completions" for u in t.urls]

        for t in targets:  # warm-up: connections, caches, JIT-free but allocator-warm
            uvloop.run(
                run_closed_loop(
                    "warmup",
                    chat_urls(t),
                    lambda i: request_body(False, i),
                    16,
                    500,
                    10,
                    headers=t.headers,
                )
            )

        workloads: list[tuple[str, bool, Callable[[Target], Callable[[], Any]]]] = [
            (
                "overhead open-loop",
                False,
                lambda t: (
                    lambda: run_open_loop(
                        "",
                        chat_urls(t),
                        lambda i: request_body(False, i),
                        args.rate,
                        max_req,
                        args.seconds,
                        headers=t.headers,
                    )
                ),
            ),
            (
                "throughput non-stream",
                False,
                lambda t: (
                    lambda: run_closed_loop(
                        "",
                        chat_urls(t),
                        lambda i: request_body(False, i),
                        args.clients,
                        max_req,
                        args.seconds,
                        headers=t.headers,
                    )
                ),
            ),
            (
                "throughput stream",
                True,
                lambda t: (
                    lambda: run_closed_loop(
                        "",
                        chat_urls(t),
                        lambda i: request_body(True, i),
                        args.clients,
                        max_req,
                        args.seconds,
                        stream=True,
                        headers=t.headers,
                    )
                ),
            ),
        ]
        for round_no, label, make in rounds_of(workloads, args.rounds):
            base: dict[str, Any] | None = None
            # the direct path first (the base of `added_*`); the routers in turn, reversed every other
            # round, so that no router always runs first or last
            order = targets[:1] + (targets[1:] if round_no % 2 == 0 else targets[:0:-1])
            for t in order:
                report, cpu = run_workload(t, label, make(t))
                row = report.summary()
                row["workload"], row["target"], row["round"] = label, t.name, round_no
                ok = len(report.ok)
                row["router_cpu_s_per_1000"] = round(cpu / ok * 1000, 3) if (t.proc and ok) else None
                if report.errors:
                    row["error_kinds"] = report.error_kinds()
                if base is None:
                    base = row
                else:
                    row["added_p50_ms"] = round(row["p50_ms"] - base["p50_ms"], 2)
                    row["added_p99_ms"] = round(row["p99_ms"] - base["p99_ms"], 2)
                    row["rps_vs_direct"] = round(row["rps"] / base["rps"], 3) if base["rps"] else None
                results.append(row)
                print(orjson.dumps(row).decode(), flush=True)
        for round_no, label, _m in rounds_of(workloads, args.rounds):
            rows = {r["target"]: r for r in results if r["workload"] == label and r["round"] == round_no}
            tag = f"round {round_no}, " if args.rounds > 1 else ""
            if "corral" in rows and "corral-nolimits" in rows and rows["corral-nolimits"]["rps"]:
                ratio = rows["corral"]["rps"] / rows["corral-nolimits"]["rps"]
                print(f"{tag}{label}: corral with limits / without, requests/s = {ratio:.3f}")
                rows["corral"]["rps_vs_nolimits"] = round(ratio, 3)
                cpu_on, cpu_off = (rows[n]["router_cpu_s_per_1000"] for n in ("corral", "corral-nolimits"))
                if cpu_on and cpu_off:
                    print(
                        f"{label}: corral with limits / without, router CPU per request = "
                        f"{cpu_on / cpu_off:.3f}"
                    )
                    rows["corral"]["cpu_vs_nolimits"] = round(cpu_on / cpu_off, 3)
            if "corral" in rows and "corral-baseline" in rows and rows["corral-baseline"]["rps"]:
                ratio = rows["corral"]["rps"] / rows["corral-baseline"]["rps"]
                print(f"{tag}{label}: corral / corral-baseline, requests/s = {ratio:.3f}")
                rows["corral"]["rps_vs_baseline"] = round(ratio, 3)
                cpu_new, cpu_old = (rows[n]["router_cpu_s_per_1000"] for n in ("corral", "corral-baseline"))
                if cpu_new and cpu_old:
                    ratio = cpu_new / cpu_old
                    print(f"{tag}{label}: corral / corral-baseline, router CPU per request = {ratio:.3f}")
                    rows["corral"]["cpu_vs_baseline"] = round(ratio, 3)
            if "corral" in rows and "corral-traced" in rows and rows["corral"]["rps"]:
                traced, untraced = rows["corral-traced"], rows["corral"]
                traced["rps_vs_untraced"] = round(traced["rps"] / untraced["rps"], 3)
                print(f"{tag}{label}: corral-traced / corral, requests/s = {traced['rps_vs_untraced']:.3f}")
                if traced["router_cpu_s_per_1000"] and untraced["router_cpu_s_per_1000"]:
                    ratio = traced["router_cpu_s_per_1000"] / untraced["router_cpu_s_per_1000"]
                    print(f"{tag}{label}: corral-traced / corral, router CPU per request = {ratio:.3f}")
                    traced["cpu_vs_untraced"] = round(ratio, 3)
            if "lean-prototype" in rows and "vllm-router" in rows and rows["vllm-router"]["rps"]:
                proto, rust_row = rows["lean-prototype"], rows["vllm-router"]
                proto["rps_vs_vllm_router"] = round(proto["rps"] / rust_row["rps"], 3)
                if proto["router_cpu_s_per_1000"] and rust_row["router_cpu_s_per_1000"]:
                    ratio = proto["router_cpu_s_per_1000"] / rust_row["router_cpu_s_per_1000"]
                    print(f"{tag}{label}: lean-prototype/vllm-router router CPU per request = {ratio:.2f}")
                    proto["cpu_vs_vllm_router"] = round(ratio, 3)
            for name in ("corral", "corral-lean"):
                if name not in rows or "vllm-router" not in rows or not rows["vllm-router"]["rps"]:
                    continue
                ratio = rows[name]["rps"] / rows["vllm-router"]["rps"]
                print(f"{tag}{label}: {name}/vllm-router requests/s = {ratio:.2f}")
                rows[name]["rps_vs_vllm_router"] = round(ratio, 3)
                cpu_corral, cpu_rust = (rows[n]["router_cpu_s_per_1000"] for n in (name, "vllm-router"))
                if cpu_corral and cpu_rust:
                    ratio = cpu_corral / cpu_rust
                    print(f"{tag}{label}: {name}/vllm-router router CPU per request = {ratio:.2f}")
                    rows[name]["cpu_vs_vllm_router"] = round(ratio, 3)
        if args.rounds > 1:
            print(rounds_summary(results, [label for label, _s, _m in workloads]))
        (out / "bench_router.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
        if args.markdown:
            print(markdown(results))
        if sink is not None:
            with urllib.request.urlopen(sink.url + "/count", timeout=5) as answer:
                print(f"corral-traced exported {answer.read().decode()} spans to the receiver")
    finally:
        for p in reversed(procs):
            p.stop()


def rounds_of(
    workloads: list[tuple[str, bool, Callable[[Target], Callable[[], Any]]]], rounds: int
) -> list[tuple[int, str, Callable[[Target], Callable[[], Any]]]]:
    """Every workload, `rounds` times over: (round, label, runner maker), round by round."""
    return [(r, label, make) for r in range(rounds) for label, _stream, make in workloads]


def rounds_summary(results: list[dict[str, Any]], labels: list[str]) -> str:
    """Per workload, the ratios each round measured against the baseline and vllm-router: their median
    and their range (the spread over rounds is the noise a single round's ratio carries)."""
    lines = ["over rounds: median [min, max] of each round's ratio"]
    for label in labels:
        rows = [r for r in results if r["workload"] == label and r["target"] == "corral"]
        for key in ("cpu_vs_baseline", "rps_vs_baseline", "cpu_vs_vllm_router"):
            values = sorted(r[key] for r in rows if r.get(key) is not None)
            if values:
                median = statistics.median(values)
                lines.append(
                    f"{label}: corral {key} = {median:.3f} [{values[0]:.3f}, {values[-1]:.3f}] "
                    f"over {len(values)} rounds"
                )
    return "\n".join(lines)


def markdown(results: list[dict[str, Any]]) -> str:
    cols = [
        "workload",
        "target",
        "requests",
        "errors",
        "rps",
        "p50_ms",
        "p99_ms",
        "added_p50_ms",
        "added_p99_ms",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "router_cpu_s_per_1000",
        "rps_vs_direct",
        "rps_vs_vllm_router",
        "cpu_vs_vllm_router",
        "rps_vs_nolimits",
        "cpu_vs_nolimits",
        "rps_vs_baseline",
        "cpu_vs_baseline",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in results:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
