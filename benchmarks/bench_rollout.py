"""Rolling upgrade under load: what `corral rollout` and `corral rollback` cost the traffic of a local
fleet, against a steady-state baseline measured in the same run.

Setup: `corral up --engines 4 --group-size 2` (two serving groups of two simulated engines, each under
`corral supervise`, and a router) with `XDG_STATE_HOME` in a temporary directory. One closed-loop load
runs through the router for the whole run: `--clients` workers, each sending its next chat completion
when the last one ends, alternately streamed and non-streamed (`--max-tokens` tokens each). The run is
cut into phases by time; a request belongs to the phase in which it was sent:

  warmup     the first seconds (not reported on its own)
  baseline   steady state, `--baseline-seconds`
  rollout    while `corral rollout --to BUNDLE` runs (BUNDLE = the same engine args plus
             `--version-string`, so every engine's fingerprint changes)
  settle     a few seconds between the two operations
  rollback   while `corral rollback` runs
  tail       a few seconds after it

Per phase: requests completed, failed before the stream (an error status or a connection error before
the answer began: a request the router should have retried elsewhere; for a non-streamed request, any
failure), streams cut (a streamed answer that began with 200 but ended without `[DONE]`, on a
connection error or with an error event), requests/s (completed / phase length),
TTFT p50/p99 of the streamed requests (to the first SSE event), latency p50/p99 of the non-streamed
ones; ratios rollout/baseline and rollback/baseline; and each operation's total time and per-step
timings from its change record ($XDG_STATE_HOME/corral/rollout-PORT.json, rollback-PORT.json),
with each drained engine's confirmed-drain report (router acknowledgement, leaving routing, in-flight
drain, engine stop). Every request that did not complete is listed with its time, phase and error.
The whole result is also written to benchmarks/out/bench_rollout.json.

With `--compare`, the same run starts two fleets one after the other under the same load and rolls
each forward once (no rollback): "plain" (router without slow start, no canary) and "guarded" (`corral up
--router-arg=--slow-start-seconds=S`, `corral rollout --canary-seconds C`), and prints each one's baseline
and rollout phases, then the guarded/plain ratios of TTFT p50/p99 during the rollout (raw, and each
rollout against its own baseline, since the two fleets run minutes apart), the failures of each and the
guarded rollout's canary verdicts. The simulator has no warm-up cost of its own: what the guarded run
can show is the price of the canary's wait and the ramp, not a cold engine's first requests spared.

Loopback only; bounded in count (`--max-requests`) and time (`--max-seconds` for the load, a timeout
for each command). Whatever happens, the fleet is stopped at the end (SIGINT to `corral up`, a wait,
then SIGKILL to whatever of it is left).
    .venv/bin/python benchmarks/bench_rollout.py [--baseline-seconds 15] [--clients 16] [--markdown]
    .venv/bin/python benchmarks/bench_rollout.py --compare [--slow-start-seconds 10] [--canary-seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corral.fleet.local import ports
from loadgen import _quantile, chat_body, check_loopback

ROOT = Path(__file__).resolve().parent.parent
MODEL = "sim-model"
PHASES = ("warmup", "baseline", "rollout", "settle", "rollback", "tail")
REPORTED = ("baseline", "rollout", "rollback")
KINDS = ("completed", "failed_before_stream", "broken")


def free_port() -> int:
    return ports.free_port("127.0.0.1")


# -- the load ---------------------------------------------------------------------------------------


@dataclass
class Sample:
    phase: str
    stream: bool
    sent: float  # time.time() when sent, to line failures up with the change record's steps
    kind: str  # "completed" | "failed_before_stream" | "broken"
    latency: float
    ttft: float | None = None
    detail: str = ""


@dataclass
class Load:
    """Closed loop through the router, alternately streamed and non-streamed, until stopped (bounded)."""

    url: str
    clients: int
    max_tokens: int
    max_requests: int
    max_seconds: float
    phase: str = "warmup"
    samples: list[Sample] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)  # phase -> monotonic span
    _phase_started: float = field(default_factory=time.monotonic)

    def enter(self, phase: str) -> None:
        now = time.monotonic()
        self.windows[self.phase] = (self._phase_started, now)
        self.phase, self._phase_started = phase, now

    def finish(self) -> None:
        self.enter("done")
        self.stop.set()

    async def _one(self, session: aiohttp.ClientSession, i: int) -> Sample:
        stream = bool(i % 2)
        phase, sent, start = self.phase, time.time(), time.perf_counter()
        body = chat_body(MODEL, stream, self.max_tokens, i)
        headers = {"Content-Type": "application/json"}

        def sample(kind: str, detail: str = "", ttft: float | None = None) -> Sample:
            return Sample(phase, stream, sent, kind, time.perf_counter() - start, ttft, detail)

        try:
            resp = await session.post(self.url + "/v1/chat/completions", data=body, headers=headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return sample("failed_before_stream", f"connect/send: {exc!r}")
        async with resp:
            if resp.status != 200:
                try:
                    text = (await resp.read())[:300]
                except (aiohttp.ClientError, TimeoutError) as exc:
                    text = repr(exc).encode()
                return sample("failed_before_stream", f"HTTP {resp.status}: {text!r}")
            if not stream:
                try:
                    reply = orjson.loads(await resp.read())
                    ok = bool(reply["choices"][0]["finish_reason"])
                except (
                    aiohttp.ClientError,
                    TimeoutError,
                    orjson.JSONDecodeError,
                    KeyError,
                    IndexError,
                ) as exc:
                    return sample("failed_before_stream", f"body: {exc!r}")
                return (
                    sample("completed")
                    if ok
                    else sample("failed_before_stream", f"no finish_reason: {reply}")
                )
            events: list[bytes] = []
            ttft: float | None = None
            try:
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        if ttft is None:
                            ttft = time.perf_counter() - start
                        events.append(line[6:].strip())
            except (aiohttp.ClientError, TimeoutError) as exc:
                return sample("broken", f"cut after {len(events)} events: {exc!r}", ttft)
        if not events or events[-1] != b"[DONE]" or any(e.startswith(b'{"error"') for e in events):
            return sample("broken", f"ended badly after {len(events)} events: {events[-3:]!r}", ttft)
        return sample("completed", "", ttft)

    async def run(self) -> None:
        check_loopback(self.url)
        deadline = time.monotonic() + self.max_seconds
        counter = iter(range(self.max_requests))
        timeout = aiohttp.ClientTimeout(total=30)
        connector = aiohttp.TCPConnector(limit=self.clients)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

            async def worker() -> None:
                for i in counter:
                    if self.stop.is_set() or time.monotonic() > deadline:
                        return
                    self.samples.append(await self._one(session, i))

            await asyncio.gather(*(worker() for _ in range(self.clients)))

    def stats(self, phase: str) -> dict[str, Any]:
        mine = [s for s in self.samples if s.phase == phase]
        kinds = Counter(s.kind for s in mine)
        start, end = self.windows.get(phase, (0.0, 0.0))
        seconds = end - start
        done = [s for s in mine if s.kind == "completed"]
        ttfts = [s.ttft for s in done if s.stream and s.ttft is not None]
        plain = [s.latency for s in done if not s.stream]
        return {
            "phase": phase,
            "seconds": round(seconds, 2),
            "completed": kinds["completed"],
            "failed_before_stream": kinds["failed_before_stream"],
            "streams_cut": kinds["broken"],
            "rps": round(kinds["completed"] / seconds, 1) if seconds > 0 else float("nan"),
            "ttft_p50_ms": round(_quantile(ttfts, 0.5) * 1000, 2),
            "ttft_p99_ms": round(_quantile(ttfts, 0.99) * 1000, 2),
            "latency_p50_ms": round(_quantile(plain, 0.5) * 1000, 2),
            "latency_p99_ms": round(_quantile(plain, 0.99) * 1000, 2),
        }


# -- the processes ----------------------------------------------------------------------------------


@dataclass
class Child:
    """A `python -m corral ...` in its own session, its output in a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def start(cls, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> Child:
        log = log_dir / f"{name}.log"
        with log.open("wb") as fh:
            popen = subprocess.Popen(
                [sys.executable, "-m", "corral", *args],
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
                start_new_session=True,
            )
        return cls(name, popen, log)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int, grace: float) -> str:
        """`sig` to the process group, wait `grace` s, then SIGKILL it and every descendant left."""
        if self.popen.poll() is not None:
            return f"{self.name}: already exited {self.popen.returncode}"
        try:
            family = psutil.Process(self.popen.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass
        note = ""
        try:
            code = self.popen.wait(grace)
            note = f"{self.name}: exited {code} after {signal.Signals(sig).name}"
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait(10)
            note = f"{self.name}: KILLED after {grace:g}s without exiting on {signal.Signals(sig).name}"
        left = [p for p in family if _alive(p)]
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if left:
            note += f"; killed {len(left)} descendant(s) left running: {[p.pid for p in left]}"
        return note


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def wait_exit(child: Child, within: float) -> int:
    deadline = time.monotonic() + within
    while (code := child.popen.poll()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{child.name} still running after {within:g}s:\n{child.output()[-3000:]}")
        await asyncio.sleep(0.1)
    return code


def wait_router_url(up: Child, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if match := re.search(r"router: (http://\S+)", up.output()):
            return match.group(1)
        if up.popen.poll() is not None:
            raise SystemExit(f"corral up exited {up.popen.returncode}:\n{up.output()[-3000:]}")
        time.sleep(0.2)
    raise SystemExit(f"corral up printed no router URL within {timeout:g}s:\n{up.output()[-3000:]}")


# -- one run ----------------------------------------------------------------------------------------


@dataclass
class Operation:
    kind: str
    code: int
    wall: float  # the command's own wall time (process start to exit)
    record: dict[str, Any] | None
    output: str


async def operation(
    kind: str,
    args: list[str],
    env: dict[str, str],
    work: Path,
    port: int,
    within: float,
    children: list[Child],
) -> Operation:
    child = Child.start(kind, [kind, "--port", str(port), *args], env, work)
    children.append(child)
    code = await wait_exit(child, within)
    path = work / "state" / "corral" / f"{kind}-{port}.json"
    record = orjson.loads(path.read_bytes()) if path.exists() else None
    return Operation(kind, code, time.monotonic() - child.started, record, child.output())


async def measure(
    args: argparse.Namespace,
    url: str,
    port: int,
    env: dict[str, str],
    work: Path,
    children: list[Child],
    canary_seconds: float = 0.0,
    rollback: bool = True,
) -> tuple[Load, list[Operation]]:
    bundle = work / "v2.yaml"
    engine_args = [*args.sim_arg, "--version-string", args.version_string]
    bundle.write_bytes(orjson.dumps({"name": "v2", "engine_args": engine_args}))  # JSON is YAML
    load = Load(url, args.clients, args.max_tokens, args.max_requests, args.max_seconds)
    task = asyncio.create_task(load.run())
    ops: list[Operation] = []
    try:
        await asyncio.sleep(args.warmup_seconds)
        load.enter("baseline")
        await asyncio.sleep(args.baseline_seconds)
        load.enter("rollout")
        forward = ["--to", str(bundle), "--canary-seconds", str(canary_seconds)]
        ops.append(await operation("rollout", forward, env, work, port, args.op_timeout, children))
        load.enter("settle")
        await asyncio.sleep(args.settle_seconds)
        if ops[0].code == 0 and rollback:
            load.enter("rollback")
            ops.append(await operation("rollback", [], env, work, port, args.op_timeout, children))
            load.enter("tail")
            await asyncio.sleep(args.settle_seconds)
    finally:
        load.finish()
        await task
    return load, ops


# -- the report -------------------------------------------------------------------------------------


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b and not math.isnan(a) and not math.isnan(b) else float("nan")


RATIO_KEYS = ("rps", "ttft_p50_ms", "ttft_p99_ms", "latency_p50_ms", "latency_p99_ms")


def step_rows(record: dict[str, Any]) -> list[tuple[str, str, float]]:
    return [(s["step"], s["group"] or "", float(s["seconds"])) for s in record.get("steps", [])]


DRAIN_KEYS = ("acknowledged_after_s", "propagation_seconds", "drain_seconds", "stop_seconds")


def drain_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Each drained engine's confirmed-drain report, from the DRAIN steps' data (the supervisor's)."""
    rows = []
    for step in record.get("steps", []):
        if step["step"] != "DRAIN":
            continue
        for engine, r in ((step.get("data") or {}).get("reports") or {}).items():
            row = {"group": step["group"], "engine": engine}
            row.update({k: round(float(r.get(k) or 0.0), 3) for k in DRAIN_KEYS})
            row["arrivals_while_leaving"] = r.get("arrivals_while_leaving")
            row["acked_by"] = len(r.get("routers_acknowledged") or [])
            row["missing"] = len(r.get("routers_missing") or [])
            row["killed"] = r.get("engine_killed")
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], ops: list[Operation]) -> str:
    cols = [
        ("phase", "phase"),
        ("seconds", "s"),
        ("completed", "completed"),
        ("failed_before_stream", "failed before stream"),
        ("streams_cut", "streams cut"),
        ("rps", "req/s"),
        ("ttft_p50_ms", "TTFT p50 ms"),
        ("ttft_p99_ms", "TTFT p99 ms"),
        ("latency_p50_ms", "latency p50 ms"),
        ("latency_p99_ms", "latency p99 ms"),
    ]
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(k, "")) for k, _ in cols) + " |")
    for r in rows:
        if "vs_baseline" in r:
            v = r["vs_baseline"]
            cells = ["", "", "", "", "", *(f"{v[k]}×" for k in RATIO_KEYS)]
            lines.append(f"| {r['phase']} / baseline | " + " | ".join(cells[1:]) + " |")
    recorded = [op for op in ops if op.record]
    if recorded:
        lines += ["", "| step | " + " | ".join(f"{op.kind} group | {op.kind} s" for op in recorded) + " |"]
        lines.append("|---|" + "---|---|" * len(recorded))
        tables = [step_rows(op.record or {}) for op in recorded]
        for i in range(max(len(t) for t in tables)):
            name = next((t[i][0] for t in tables if i < len(t)), "")
            cells = [f"{t[i][1]} | {t[i][2]:.2f}" if i < len(t) else " | " for t in tables]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        totals = [
            f"{op.kind}: {op.record['outcome'] if op.record else '?'} in {total(op):.2f} s "
            f"(change record started → finished; the command's wall time {op.wall:.2f} s)  "
            for op in recorded
        ]
        lines += ["", *totals]
        lines += [
            "",
            "| operation | group | engine | router ack s | leave routing s | in-flight drain s "
            "| engine stop s | arrivals while leaving |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for op in recorded:
            for d in drain_rows(op.record or {}):
                cells = [op.kind, d["group"], d["engine"], *(str(d[k]) for k in DRAIN_KEYS)]
                lines.append("| " + " | ".join([*cells, str(d["arrivals_while_leaving"])]) + " |")
    return "\n".join(lines)


def total(op: Operation) -> float:
    r = op.record or {}
    return float(r.get("finished", 0.0)) - float(r.get("started", 0.0))


def report(load: Load, ops: list[Operation], args: argparse.Namespace, out: Path) -> int:
    rows = [load.stats(p) for p in REPORTED if p in load.windows]
    base = rows[0]
    for r in rows[1:]:
        r["vs_baseline"] = {k: ratio(r[k], base[k]) for k in RATIO_KEYS}
    for r in rows:
        print(orjson.dumps(r).decode(), flush=True)
    everything = Counter(s.kind for s in load.samples)
    print(f"all phases (warm-up, settle and tail included): {dict(everything)}")
    for op in ops:
        record = op.record
        if record is None:
            print(f"{op.kind}: exit {op.code}, NO change record; output:\n{op.output[-3000:]}")
            continue
        print(
            f"{op.kind}: exit {op.code}, outcome {record['outcome']}, total {total(op):.2f} s "
            f"(command wall {op.wall:.2f} s): {record['reason']}"
        )
        for step, group, seconds in step_rows(record):
            print(f"  {step:<9} {group:<8} {seconds:7.2f} s")
        for d in drain_rows(record):
            print(f"  drain {d['group']} {d['engine']}: " + orjson.dumps(d).decode())
    for op in ops:
        if op.code != 0:
            print(f"{op.kind} output:\n{op.output[-3000:]}")
    bad = [s for s in load.samples if s.kind != "completed"]
    if bad:
        print(f"{len(bad)} request(s) did not complete:")
        for s in bad[:50]:
            when = time.strftime("%H:%M:%S", time.gmtime(s.sent)) + f".{int(s.sent % 1 * 1000):03d}"
            print(f"  {when} UTC  {s.phase:<8} {'stream' if s.stream else 'plain':<6} {s.kind}: {s.detail}")
    results = {
        "args": vars(args),
        "phases": rows,
        "all_phases": dict(everything),
        "operations": [
            {"kind": op.kind, "code": op.code, "wall": op.wall, "record": op.record} for op in ops
        ],
        "failures": [vars(s) for s in bad],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_rollout.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2, default=str))
    if args.markdown:
        print(markdown(rows, ops))
    ok = not bad and len(ops) == 2 and all(op.code == 0 for op in ops)
    return 0 if ok else 1


def start_fleet(
    args: argparse.Namespace, work: Path, env: dict[str, str], port: int, extra: list[str]
) -> Child:
    up_args = ["up", "--engines", "4", "--group-size", "2", "--port", str(port), *extra]
    up_args += [f"--sim-arg={a}" for a in args.sim_arg]
    up_args += ["--log-dir", str(work / "logs")]
    (work / "logs").mkdir(parents=True)
    return Child.start("up", up_args, env, work)


def stop_all(children: list[Child]) -> None:
    for child in reversed(children):
        grace = 90.0 if child.name == "up" else 10.0
        note = child.stop(signal.SIGINT, grace)
        if "already exited" not in note or child.name == "up":
            print(note, flush=True)


VARIANTS = ("plain", "guarded")  # guarded: router slow start + the rollout's canary


def run_variant(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """One fresh fleet, its baseline and one rollout under the load; the phases' figures."""
    guarded = variant == "guarded"
    work = Path(tempfile.mkdtemp(prefix=f"bench-rollout-{variant}-"))
    env = {"XDG_STATE_HOME": str(work / "state")}
    port = free_port()
    extra = [f"--router-arg=--slow-start-seconds={args.slow_start_seconds:g}"] if guarded else []
    children: list[Child] = []
    try:
        up = start_fleet(args, work, env, port, extra)
        children.append(up)
        url = wait_router_url(up, 120)
        canary = args.canary_seconds if guarded else 0.0
        load, ops = asyncio.run(measure(args, url, port, env, work, children, canary, rollback=False))
    finally:
        stop_all(children)
    record = ops[0].record or {}
    verdicts = [
        f"{s['group']}: {(s.get('data') or {}).get('verdict', {}).get('verdict')} ({s['detail']})"
        for s in record.get("steps", [])
        if s["step"] == "CANARY"
    ]
    base, moving = load.stats("baseline"), load.stats("rollout")
    return {
        "variant": variant,
        "slow_start_seconds": args.slow_start_seconds if guarded else 0.0,
        "canary_seconds": canary,
        "baseline": base,
        "rollout": moving,
        # each variant against its own baseline: the two fleets run minutes apart on a shared machine
        "rollout_vs_baseline": {k: ratio(moving[k], base[k]) for k in RATIO_KEYS},
        "outcome": record.get("outcome"),
        "rollout_seconds": round(total(ops[0]), 2),
        "canary": verdicts,
        "failures": [f"{s.phase} {s.kind}: {s.detail}" for s in load.samples if s.kind != "completed"][:20],
    }


def compare(args: argparse.Namespace) -> int:
    results = [run_variant(args, v) for v in VARIANTS]
    for r in results:
        print(orjson.dumps(r).decode(), flush=True)
    plain, guarded = (r["rollout"] for r in results)
    keys = ("ttft_p50_ms", "ttft_p99_ms", "latency_p99_ms", "rps")
    ratios = {k: ratio(guarded[k], plain[k]) for k in keys}
    a, b = (r["rollout_vs_baseline"] for r in results)
    relative = {k: ratio(b[k], a[k]) for k in keys}
    print(orjson.dumps({"guarded_vs_plain_during_rollout": ratios}).decode())
    print(orjson.dumps({"guarded_vs_plain_each_against_its_baseline": relative}).decode())
    if args.markdown:
        print(
            "| variant | rollout s | phase | completed | failed | cut | req/s | TTFT p50 ms | TTFT p99 ms |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in results:
            for phase in ("baseline", "rollout"):
                p = r[phase]
                cells = [r["variant"], str(r["rollout_seconds"]), phase, str(p["completed"])]
                cells += [str(p["failed_before_stream"]), str(p["streams_cut"]), str(p["rps"])]
                cells += [str(p["ttft_p50_ms"]), str(p["ttft_p99_ms"])]
                print("| " + " | ".join(cells) + " |")
        print(f"\nguarded / plain during the rollout: {ratios}")
        print(f"guarded / plain, each rollout against its own baseline: {relative}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_rollout_compare.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    ok = all(r["outcome"] == "succeeded" and not r["failures"] for r in results)
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--clients", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--warmup-seconds", type=float, default=3.0)
    parser.add_argument("--baseline-seconds", type=float, default=15.0)
    parser.add_argument("--settle-seconds", type=float, default=3.0)
    parser.add_argument("--op-timeout", type=float, default=300.0, help="seconds for each rollout/rollback")
    parser.add_argument("--max-requests", type=int, default=500_000, help="bound on the whole run's requests")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="bound on the load's duration")
    parser.add_argument(
        "--sim-arg",
        action="append",
        default=None,
        help="passed to every engine (repeatable) [default: --itl-ms=5]",
    )
    parser.add_argument("--version-string", default="0.33.1", help="what the new bundle changes")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    parser.add_argument("--compare", action="store_true", help="plain vs slow start + canary (see above)")
    parser.add_argument("--slow-start-seconds", type=float, default=10.0, help="the guarded router's")
    parser.add_argument("--canary-seconds", type=float, default=5.0, help="the guarded rollout's")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/out"))
    args = parser.parse_args()
    args.sim_arg = args.sim_arg or ["--itl-ms=5"]
    if args.compare:
        raise SystemExit(compare(args))

    work = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    env = {"XDG_STATE_HOME": str(work / "state")}
    port = free_port()
    children: list[Child] = []
    code = 1
    try:
        up = start_fleet(args, work, env, port, [])
        children.append(up)
        started = time.monotonic()
        url = wait_router_url(up, 120)
        print(f"fleet up at {url} in {time.monotonic() - started:.1f}s (work dir {work})", flush=True)
        load, ops = asyncio.run(measure(args, url, port, env, work, children))
        code = report(load, ops, args, Path(args.out))
    finally:
        stop_all(children)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
