"""Supervisor state stream benchmark (not a test): how fast a supervisor's state change takes an
endpoint out of a router's table and comes back acknowledged, and what a stream of state changes
costs the data path.

Setup: `--engines` `corral sim` engines, each `--supervised` in one `corral router` by a scripted
supervisor (this process, in a thread) that serves `/eN/v1/state/watch` and `/eN/v1/acks` the way
`corral supervise` does. The scripted supervisor moves one engine READY -> DRAINING (or back) every
`--period` seconds while closed-loop load runs through the router.

Measured, all on CLOCK_MONOTONIC (one clock for every process of a Linux host):
  removal latency  the supervisor writing the DRAINING line -> the router's exit record for it
  ack latency      the supervisor writing the DRAINING line -> the router's acknowledgement arriving
                   (removal, then waiting for requests still being dispatched there, then the POST)
  throughput       with the state changes vs. the same router and engines without them

    .venv/bin/python benchmarks/bench_supervisor_streams.py [--engines 8] [--seconds 10] [--clients 32]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tests.support.procs import CorralProcess, free_port  # noqa: E402

from bench_membership import describe, get_json, load, quantile, routable, wait_for  # noqa: E402

SIM = ("--model", "sim-model", "--seed", "0", "--ttft-base-ms", "1", "--itl-ms", "1", "--max-num-seqs", "256")


class ScriptedSupervisors:
    """Many supervisors' state streams on one port, moved by `flip`; records timings."""

    def __init__(self, count: int) -> None:
        self.port = free_port()
        self.states = {f"e{i}": ["READY", 1] for i in range(count)}
        self.streams: dict[str, list[asyncio.Queue[bytes]]] = {name: [] for name in self.states}
        self.written: dict[tuple[str, int], float] = {}  # (name, epoch) of a DRAINING line -> when
        self.acked: dict[tuple[str, int], float] = {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def _line(self, name: str) -> bytes:
        state, epoch = self.states[name]
        line = {"type": "state", "epoch": epoch, "state": state, "sub_state": None, "reason": "bench"}
        return orjson.dumps({**line, "time": time.time()}) + b"\n"

    async def watch(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.streams[name].append(queue)
        heartbeat = float(request.query.get("heartbeat", "2"))
        try:
            await resp.write(self._line(name))
            while True:
                try:
                    line = await asyncio.wait_for(queue.get(), heartbeat)
                except TimeoutError:
                    line = orjson.dumps({"type": "heartbeat", "epoch": self.states[name][1]}) + b"\n"
                if b'"DRAINING"' in line:
                    self.written.setdefault((name, int(orjson.loads(line)["epoch"])), time.monotonic())
                await resp.write(line)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.streams[name].remove(queue)
        return resp

    async def ack(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.acked.setdefault((request.match_info["name"], int(body["epoch"])), time.monotonic())
        return web.json_response({"ok": True})

    def flip(self, name: str) -> None:
        def change() -> None:
            state, epoch = self.states[name]
            self.states[name] = ["DRAINING" if state == "READY" else "READY", epoch + 1]
            for queue in self.streams[name]:
                queue.put_nowait(self._line(name))

        self.loop.call_soon_threadsafe(change)

    def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{name}/v1/state/watch", self.watch)
        app.router.add_post("/{name}/v1/acks", self.ack)
        self._thread.start()
        runner = web.AppRunner(app, shutdown_timeout=0.1)

        async def serve() -> None:
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()

        asyncio.run_coroutine_threadsafe(serve(), self.loop).result(10)


def flipper(sups: ScriptedSupervisors, period: float, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        names = list(sups.states)
        i = 0
        while not stop.wait(period):
            sups.flip(names[(i // 2) % len(names)])  # one engine down at a time: down, then up
            i += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--period", type=float, default=0.1, help="seconds between state changes")
    args = parser.parse_args()

    sups = ScriptedSupervisors(args.engines)
    sups.start()
    ports = [free_port() for _ in range(args.engines)]
    sims = [CorralProcess(["sim", "--host", "127.0.0.1", "--port", str(p), *SIM]) for p in ports]
    router: CorralProcess | None = None
    try:
        for port, sim in zip(ports, sims, strict=True):
            sim.wait_http(f"http://127.0.0.1:{port}/health", timeout=120)
        pairs = [f"http://127.0.0.1:{p}={sups.url(f'e{i}')}" for i, p in enumerate(ports)]
        router_port = free_port()
        router = CorralProcess(
            ["router", "--port", str(router_port), "--policy", "least_request", "--log-level", "warning",
             "--router-id", "bench", "--workers", "1", *[a for pair in pairs for a in ("--supervised", pair)]]
        )  # fmt: skip
        url = f"http://127.0.0.1:{router_port}"
        router.wait_http(url + "/health")
        wait_for(lambda: routable(url) == args.engines, 60, "supervised endpoints")

        steady = load(url, "steady", args.clients, args.seconds)
        print(f"no state changes, {args.engines} supervised endpoints: {describe(steady)}", flush=True)

        stop = threading.Event()
        thread = flipper(sups, args.period, stop)
        changing = load(url, "changing", args.clients, args.seconds)
        stop.set()
        thread.join(5)
        time.sleep(1.0)

        engine_of = {sups.url(f"e{i}"): f"http://127.0.0.1:{p}" for i, p in enumerate(ports)}
        name_of = {engine: sup.rsplit("/", 1)[1] for sup, engine in engine_of.items()}
        exits = [
            e for e in get_json(url + "/v1/fleet")["left_routing"] if e["cause"] == "supervisor_draining"
        ]
        removal: list[float] = []
        drained = sorted(sups.written.items(), key=lambda kv: kv[1])
        for e in exits:
            name = name_of[e["url"]]
            before = [t for (n, _), t in drained if n == name and t <= e["at_monotonic"]]
            if before:
                removal.append(e["at_monotonic"] - before[-1])
        acks = [sups.acked[k] - t for k, t in sups.written.items() if k in sups.acked]

        def ms(values: list[float], q: float) -> float:
            return round(quantile(values, q) * 1000, 3)

        print(f"state change every {args.period * 1000:.0f} ms: {describe(changing)}")
        print(f"throughput, changing vs steady: {changing.rps / steady.rps * 100:.1f} %")
        print(
            f"removal latency, DRAINING line written -> out of the table ({len(removal)}): "
            f"p50 {ms(removal, 0.5)} ms  p99 {ms(removal, 0.99)} ms  max {ms(removal, 1.0)} ms"
        )
        print(
            f"ack latency, DRAINING line written -> acknowledgement received ({len(acks)} of "
            f"{len(sups.written)}): p50 {ms(acks, 0.5)} ms  p99 {ms(acks, 0.99)} ms  max {ms(acks, 1.0)} ms"
        )
        result: dict[str, Any] = {
            "engines": args.engines,
            "clients": args.clients,
            "period_s": args.period,
            "steady_rps": round(steady.rps, 1),
            "changing_rps": round(changing.rps, 1),
            "errors": changing.errors,
            "removal_ms": {"p50": ms(removal, 0.5), "p99": ms(removal, 0.99)},
            "ack_ms": {"p50": ms(acks, 0.5), "p99": ms(acks, 0.99)},
        }
        print(orjson.dumps(result).decode())
    finally:
        if router is not None:
            router.stop()
        for sim in sims:
            sim.stop()


if __name__ == "__main__":
    main()
