"""bench_scale's live section: N fake engines in one process, `corral router` alone on CPU 0, and the
load generator; the router's idle CPU, then req/s and p99 per policy.

Each fake engine is a port of one uvloop process speaking just enough HTTP/1.1 (keep-alive, bodies by
Content-Length) to answer what a real vLLM answers, byte for byte from tests/data/vllm-samples:
`/metrics` (a real 54 KB page), `/v1/models` (its model renamed), `/health`, `/version`, and chat
completions (a real non-streamed body). It counts the requests per path, so the report says how often
each engine was scraped.

    python benchmarks/scale_fleet.py --serve N --ports-file F   (what bench_scale starts)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_router import Proc, free_port, spawn
from loadgen import run_closed_loop

MODEL = "bench-model"
SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm-samples"
CLIENTS = 32
ROUTER_CPU = {0}


def _answers() -> dict[bytes, bytes]:
    def ok(body: bytes, kind: bytes = b"application/json") -> bytes:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (kind, len(body))
        return head + body

    models = orjson.loads((SAMPLES / "models.body").read_bytes())
    for card in models["data"]:
        card["id"] = MODEL
    return {
        b"/metrics": ok((SAMPLES / "metrics.body").read_bytes(), b"text/plain; version=0.0.4"),
        b"/v1/models": ok(orjson.dumps(models)),
        b"/health": ok(b""),
        b"/version": ok((SAMPLES / "version.body").read_bytes()),
        b"/v1/chat/completions": ok((SAMPLES / "chat.body").read_bytes()),
    }


class FakeEngine(asyncio.Protocol):
    answers: ClassVar[dict[bytes, bytes]] = {}
    counts: ClassVar[Counter[bytes]] = Counter()

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            path = head.split(b" ", 2)[1].split(b"?")[0]
            self.counts[path] += 1
            answer = self.answers.get(path, b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            self.transport.write(answer)


async def serve(count: int, ports_file: Path) -> None:
    FakeEngine.answers = _answers()
    loop = asyncio.get_running_loop()
    ports = []
    for _ in range(count):
        server = await loop.create_server(FakeEngine, "127.0.0.1", 0, backlog=64)
        ports.append(server.sockets[0].getsockname()[1])
    ports_file.write_text("\n".join(map(str, ports)))  # noqa: ASYNC240 - once, before serving
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    stats = ports_file.with_suffix(".stats")
    while not stop.is_set():
        stats.write_bytes(orjson.dumps({k.decode(): v for k, v in FakeEngine.counts.items()}))
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            pass


def engine_counts(ports_file: Path) -> Counter[str]:
    try:
        return Counter(orjson.loads(ports_file.with_suffix(".stats").read_bytes()))
    except (OSError, orjson.JSONDecodeError):
        return Counter()


def start_engines(count: int, out: Path, cpus: set[int]) -> tuple[Proc, list[str], Path]:
    ports_file = out / f"engines-{count}.ports"
    ports_file.unlink(missing_ok=True)
    argv = [sys.executable, __file__, "--serve", str(count), "--ports-file", str(ports_file)]
    proc = spawn(f"engines-{count}", argv, "", cpus, out)
    deadline = time.monotonic() + 60
    while not ports_file.exists() or not ports_file.read_text().strip():
        if time.monotonic() > deadline or proc.popen.poll() is not None:
            raise SystemExit(f"the fake engines did not start (see {out}/engines-{count}.log)")
        time.sleep(0.1)
    urls = [f"http://127.0.0.1:{p}" for p in ports_file.read_text().split()]
    return proc, urls, ports_file


def start_router(
    urls: list[str], policy: str, out: Path, refresh: float | None, name: str = "", src: str | None = None
) -> Proc:
    """`corral router` over `urls`, alone on `ROUTER_CPU`; imported from `src` when given (another
    checkout's `src/`, to price a change against its parent)."""
    backends = out / f"backends-{name or policy}-{len(urls)}.txt"
    backends.write_text("\n".join(urls) + "\n")
    port = free_port()
    argv = [sys.executable, "-m", "corral", "router", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--backends-file", str(backends), "--policy", policy, "--log-level", "warning"]
    argv += ["--workers", "1"] + (["--models-refresh-seconds", str(refresh)] if refresh else [])
    env = {**os.environ, "PYTHONPATH": src} if src else None
    proc = spawn(
        name or f"router-{policy}-{len(urls)}", argv, f"http://127.0.0.1:{port}", ROUTER_CPU, out, env
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # every endpoint READY
        if proc.popen.poll() is not None:
            raise SystemExit(f"router exited with {proc.popen.returncode} (see {out})")
        try:
            with urllib.request.urlopen(proc.url + "/health", timeout=5) as r:
                if orjson.loads(r.read())["ready"] == len(urls):
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.stop()
    raise SystemExit(f"router: not every endpoint READY after 120 s ({out})")


def idle_cpu(proc: Proc, seconds: float) -> float:
    before = proc.cpu_seconds()
    time.sleep(seconds)
    return (proc.cpu_seconds() - before) / seconds


def body_for(i: int) -> bytes:
    group = i % 24
    system = f"You are assistant {group}. " + "Follow the house rules carefully. " * 18
    messages = [{"role": "system", "content": system}, {"role": "user", "content": f"question {i}"}]
    return orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 16})


WRK_SCRIPT = """
local bodies = {}
for g = 0, 23 do
  local system = "You are assistant " .. g .. ". " .. string.rep("Follow the house rules carefully. ", 18)
  bodies[g] = '{"model":"%s","messages":[{"role":"system","content":"' .. system ..
    '"},{"role":"user","content":"question"}],"max_tokens":16}'
end
local i = 0
request = function()
  i = i + 1
  return wrk.format("POST", "/v1/chat/completions", {["Content-Type"] = "application/json"}, bodies[i %% 24])
end
"""


def _ms(text: str) -> float:
    for unit, factor in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor
    return float(text)


def load(policy: str, url: str, seconds: float, out: Path) -> Load:
    """`CLIENTS` connections for `seconds`: wrk when installed, else loadgen."""
    wrk = shutil.which("wrk")
    if wrk is None:
        report = uvloop.run(
            run_closed_loop(policy, [url + "/v1/chat/completions"], body_for, CLIENTS, 10**7, seconds)
        )
        return Load(report.rps, report.latency_ms(0.99), report.errors, len(report.ok))
    script = out / "bench_scale.lua"
    script.write_text(WRK_SCRIPT % MODEL)
    argv = [wrk, "-t1", f"-c{CLIENTS}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(script), url]
    text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", text).group(1))  # type: ignore[union-attr]
    done = int(re.search(r"(\d+) requests in", text).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    failed = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    errors = (int(bad.group(1)) if bad else 0) + (sum(map(int, failed.groups())) if failed else 0)
    return Load(rps, p99, errors, done)


@dataclass
class Load:
    rps: float
    p99_ms: float
    errors: int
    requests: int
    cpu_us: float = 0.0  # the router's CPU per request (user + system)


def measure(router: Proc, policy: str, seconds: float, warmup: float, out: Path) -> Load:
    """A warm-up (not counted: first connections to the engines, rings, prefix homes), then the load,
    with the router's CPU per request."""
    if warmup > 0:
        load(policy, router.url, warmup, out)
    before = router.cpu_seconds()
    result = load(policy, router.url, seconds, out)
    result.cpu_us = (router.cpu_seconds() - before) / max(1, result.requests) * 1e6
    return result


@dataclass
class Target:
    """One (policy, endpoints) measured once per repeat, each time between two measurements of the
    baseline (round robin at the fewest endpoints, one router kept up for the whole run)."""

    policy: str
    size: int
    runs: list[Load] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # req/s over the baseline's around it
    cpu_ratios: list[float] = field(default_factory=list)  # CPU per request over the baseline's
    idle: list[float] = field(default_factory=list)
    scrapes: list[float] = field(default_factory=list)


def _spread(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def section_live(
    sizes: list[int],
    policies: list[str],
    seconds: float,
    refresh: float | None = None,
    repeats: int = 3,
    warmup: float = 1.0,
    idle_seconds: float | None = None,
    router_src: str | None = None,
    base_size: int | None = None,
) -> None:
    out = Path(os.environ.get("BENCH_OUT", "/tmp/corral-bench-scale"))
    out.mkdir(parents=True, exist_ok=True)
    others = set(range(os.cpu_count() or 2)) - ROUTER_CPU or ROUTER_CPU
    os.sched_setaffinity(0, others)
    idle_seconds = seconds if idle_seconds is None else idle_seconds
    base_size = min(sizes) if base_size is None else base_size
    print(
        f"live: each router alone on CPU {sorted(ROUTER_CPU)}, "
        f"engines and {CLIENTS} clients on {sorted(others)}"
    )
    every = f"{refresh:g} s" if refresh else "the default interval"
    print(f"      /v1/models asked every {every}; idle CPU over {idle_seconds:g} s after all READY; ")
    print(
        f"      {warmup:g} s of warm-up load, then {seconds:g} s measured; {repeats} repeats, targets in turn"
    )
    print(f"      with round_robin at {base_size} (one router up all run) measured before and after each")
    if router_src:
        print(f"      routers imported from {router_src}")
    engines: list[Proc] = []
    fleets: dict[int, tuple[list[str], Path]] = {}
    baseline: Proc | None = None
    targets = [Target(policy, size) for size in sizes for policy in policies]
    try:
        for size in sorted({base_size, *sizes}):
            proc, urls, ports_file = start_engines(size, out, others)
            engines.append(proc)
            fleets[size] = (urls, ports_file)
        baseline = start_router(fleets[base_size][0], "round_robin", out, refresh, "baseline", router_src)
        last = measure(baseline, "round_robin", seconds, warmup, out)
        print(f"  baseline round_robin at {base_size}: {last.rps:,.0f} req/s, {last.cpu_us:.0f} us CPU/req")
        for r in range(repeats):
            turn = r % len(targets)
            for target in targets[turn:] + targets[:turn]:
                urls, ports_file = fleets[target.size]
                router = start_router(urls, target.policy, out, refresh, src=router_src)
                try:
                    time.sleep(2.0)  # past the first scrape round's start
                    scraped = engine_counts(ports_file)["/metrics"]
                    idle = idle_cpu(router, idle_seconds)
                    time.sleep(1.1)  # the engines' counters are written once a second
                    rate = (engine_counts(ports_file)["/metrics"] - scraped) / (idle_seconds + 1.1)
                    run = measure(router, target.policy, seconds, warmup, out)
                finally:
                    router.stop()
                after = measure(baseline, "round_robin", seconds, 0.0, out)
                base_rps, base_cpu = (last.rps + after.rps) / 2, (last.cpu_us + after.cpu_us) / 2
                last = after
                target.runs.append(run)
                target.idle.append(idle)
                target.scrapes.append(rate)
                target.ratios.append(run.rps / base_rps)
                target.cpu_ratios.append(run.cpu_us / base_cpu)
                print(
                    f"  r{r + 1} {target.policy:14} {target.size:>5}: idle {idle * 100:4.1f}%, {rate:5.1f} "
                    f"scrapes/s; {run.rps:7,.0f} req/s, p99 {run.p99_ms:6.1f} ms, {run.errors} errors, "
                    f"{run.cpu_us:4.0f} us CPU/req | baseline {base_rps:6,.0f} req/s, {base_cpu:4.0f} us "
                    f"-> {target.ratios[-1]:.2f}x req/s, {target.cpu_ratios[-1]:.2f}x CPU/req",
                    flush=True,
                )
    finally:
        if baseline is not None:
            baseline.stop()
        for proc in engines:
            proc.stop()
    print(
        f"summary: median of {repeats} (min-max); 'x req/s' and 'x CPU/req' are over round_robin at "
        f"{base_size}, measured just before and after; 'x at one core' is 1 / 'x CPU/req', the req/s ratio "
        "if each router had its core to itself (a saturated router serves 1 / its CPU per request); "
        "it is steadier than 'x req/s' where other work shares the machine"
    )
    columns = (
        "endpoints",
        "policy",
        "idle CPU %",
        "scrapes/s",
        "req/s",
        "x req/s",
        "x CPU/req",
        "x at one core",
    )
    print("  {:>9} {:14} {:>16} {:>17} {:>20} {:>17} {:>17} {:>17} {:>17} errors".format(*columns, "p99 ms"))
    for t in targets:
        print(
            f"  {t.size:>9} {t.policy:14} {_spread([i * 100 for i in t.idle], '.1f'):>16} "
            f"{_spread(t.scrapes, '.1f'):>17} {_spread([x.rps for x in t.runs], ',.0f'):>20} "
            f"{_spread(t.ratios, '.2f'):>17} {_spread(t.cpu_ratios, '.2f'):>17} "
            f"{_spread([1 / c for c in t.cpu_ratios], '.2f'):>17} "
            f"{_spread([x.p99_ms for x in t.runs], '.1f'):>17} {sum(x.errors for x in t.runs)}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", type=int, required=True)
    parser.add_argument("--ports-file", type=Path, required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.serve, args.ports_file))


if __name__ == "__main__":
    main()
