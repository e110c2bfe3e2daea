"""1,000 watched pods with 10 membership events a second, through Kubernetes' wire protocol (issue 17,
item 4): what pod churn costs a real `corral router --discovery k8s`, and whether a request ever reaches
a pod after its DELETE.

Setup, all on loopback and bounded:
- one process serving the fake engines of bench_scale (scale_fleet's real vLLM answers), one per
  address 127.1.X.Y on one port (the router's --engine-port), the spare addresses for re-added pods
  included; it records when each address answered a chat completion;
- the test Kubernetes API server (tests/support/fake_kube.py: list + chunked watch, resourceVersions,
  label selectors) in this process, 1,000 pods `app=vllm` whose IPs are those addresses;
- `corral router --discovery k8s` pinned to CPU 0 (taskset), round_robin, one worker;
- a churn driver making `--rate` events/s for `--seconds`: ready flips (off, then back on 5 events
  later), deletes + re-adds under a new name with a NEW address (never reused), label changes that
  leave the selector (the pod is DELETED for the watch) and come back.

Phases, each `--seconds` long, router CPU sampled every second (psutil): idle without churn, idle with
churn, `--rps` open-loop chat load without churn, the same load with churn. Correctness: every request
an address answered more than `--grace` seconds after its pod was deleted (or left the selector) is a
violation; the count must be 0.

    .venv/bin/python benchmarks/bench_k8s_churn.py [--pods 1000] [--rate 10] [--seconds 60] [--rps 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import orjson
import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tests.support.fake_kube import FakeKubeThread  # noqa: E402

from bench_router import Proc, free_port, spawn  # noqa: E402
from loadgen import run_open_loop  # noqa: E402
from scale_fleet import FakeEngine, _answers, body_for  # noqa: E402

LABELS = {"app": "vllm"}
CHAT = b"/v1/chat/completions"


def address(i: int) -> str:
    return f"127.1.{i // 250}.{i % 250 + 1}"


# -- the fake engines (a child process) ---------------------------------------------------------


class CountingEngine(FakeEngine):
    """A fake engine that records, per local address, when it answered a chat completion."""

    answered: dict[str, list[float]] = defaultdict(list)  # noqa: RUF012 - one table for the process

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.ip = transport.get_extra_info("sockname")[0]

    def data_received(self, data: bytes) -> None:
        before = self.counts[CHAT]
        super().data_received(data)
        now = time.monotonic()
        self.answered[self.ip].extend([now] * (self.counts[CHAT] - before))


async def serve(count: int, port: int, ready_file: Path, stats_file: Path) -> None:
    FakeEngine.answers = _answers()
    loop = asyncio.get_running_loop()
    for i in range(count):
        await loop.create_server(CountingEngine, address(i), port, backlog=64)
    ready_file.write_text("ready")  # noqa: ASYNC240 - once, before serving
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    stats_file.write_bytes(orjson.dumps(CountingEngine.answered))  # noqa: ASYNC240 - once, at the end


# -- the churn driver ---------------------------------------------------------------------------


class Churn:
    """Events on the pods of a FakeKubeThread; remembers when each address stopped being a member."""

    def __init__(self, kube: FakeKubeThread, pods: int, seed: int = 3) -> None:
        self.kube = kube
        self.live = {f"engine-{i}": address(i) for i in range(pods)}
        self.next_address = pods
        self.rng = random.Random(seed)
        self.gone: dict[str, float] = {}  # address -> monotonic time its pod left
        self.not_ready: list[tuple[int, str]] = []  # (event number to restore at, pod)
        self.unlabelled: list[tuple[int, str]] = []
        self.events = 0
        self.kinds: dict[str, int] = defaultdict(int)

    def _pick(self) -> str:
        busy = {name for _, name in self.not_ready + self.unlabelled}
        while True:
            name = self.rng.choice(list(self.live))
            if name not in busy:
                return name

    def step(self) -> None:
        n = self.events
        self.events += 1
        for queue, restore in ((self.not_ready, self._ready), (self.unlabelled, self._relabel)):
            if queue and queue[0][0] <= n:
                restore(queue.pop(0)[1])
                return
        kind = ("ready", "replace", "label", "ready", "replace")[n % 5]
        self.kinds[kind] += 1
        name = self._pick()
        if kind == "ready":
            self.kube.call(lambda k: k.set_ready(name, False))
            self.not_ready.append((n + 5, name))
        elif kind == "label":
            ip = self.live[name]
            self.kube.call(lambda k: k.update_pod(name, lambda p: p["metadata"]["labels"].update(app="x")))
            self.gone[ip] = time.monotonic()
            self.unlabelled.append((n + 5, name))
        else:
            ip = self.live.pop(name)
            self.kube.call(lambda k: k.delete_pod(name))
            self.gone[ip] = time.monotonic()
            fresh, new_ip = f"engine-r{n}", address(self.next_address)
            self.next_address += 1
            self.live[fresh] = new_ip
            self.kube.call(lambda k: k.create_pod(fresh, new_ip, labels=LABELS))

    def _ready(self, name: str) -> None:
        self.kinds["ready back"] += 1
        self.kube.call(lambda k: k.set_ready(name, True))

    def _relabel(self, name: str) -> None:
        self.kinds["label back"] += 1
        self.kube.call(lambda k: k.update_pod(name, lambda p: p["metadata"]["labels"].update(LABELS)))
        self.gone.pop(self.live[name], None)  # a member again from here on: its requests are fine


# -- measuring ----------------------------------------------------------------------------------


def routable(url: str) -> int:
    with urllib.request.urlopen(url + "/v1/fleet", timeout=10) as resp:
        return sum(1 for e in orjson.loads(resp.read())["endpoints"] if e["routable"])


def phase(router: Proc, seconds: float, churn: Churn | None, rate: float, rps: float) -> list[float]:
    """Router CPU (fraction of a core) for each second of the phase."""
    load_thread = None
    if rps:

        def load() -> None:
            report = asyncio.run(
                run_open_loop(
                    "load", [router.url + "/v1/chat/completions"], body_for, rps, int(rps * seconds), seconds
                )
            )
            errors = sum(1 for s in report.samples if not s.ok)
            print(f"    load: {len(report.samples)} requests, {errors} not 200", flush=True)

        load_thread = threading.Thread(target=load, daemon=True)
        load_thread.start()
    samples = []
    start = time.monotonic()
    next_event = start
    last_cpu, last_t = router.cpu_seconds(), start
    while (now := time.monotonic()) < start + seconds:
        if churn is not None and now >= next_event:
            churn.step()
            next_event += 1.0 / rate
        if now - last_t >= 1.0:
            cpu = router.cpu_seconds()
            samples.append((cpu - last_cpu) / (now - last_t))
            last_cpu, last_t = cpu, now
        time.sleep(max(0.0, min(next_event if churn else now + 0.05, last_t + 1.0) - time.monotonic()))
    if load_thread is not None:
        load_thread.join(timeout=seconds + 60)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=10.0, help="membership events per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="per phase")
    parser.add_argument("--rps", type=float, default=200.0, help="open-loop chat requests per second")
    parser.add_argument("--grace", type=float, default=1.0, help="seconds a DELETE may take to reach routing")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        uvloop.run(serve(args.serve, args.port, args.dir / "engines.ready", args.dir / "engines.stats"))
        return
    spare = int(args.rate * args.seconds * 2) + 10  # new addresses for re-added pods, never reused
    out = Path(tempfile.mkdtemp(prefix="bench-k8s-churn-"))
    port = free_port()
    cpus = set(os.sched_getaffinity(0))
    others = (cpus - {0}) or cpus
    engines = spawn(
        "engines",
        [sys.executable, __file__, "--serve", str(args.pods + spare), "--port", str(port), "--dir", str(out)],
        "",
        others,
        out,
    )
    router: Proc | None = None
    try:
        deadline = time.monotonic() + 120
        while not (out / "engines.ready").exists():
            if time.monotonic() > deadline or engines.popen.poll() is not None:
                raise SystemExit(f"the fake engines did not start (see {out}/engines.log)")
            time.sleep(0.1)
        with FakeKubeThread() as kube:
            kube.kube.bookmark_interval = 10.0
            for i in range(args.pods):
                kube.call(lambda k, i=i: k.create_pod(f"engine-{i}", address(i), labels=LABELS))
            kubeconfig = kube.kube.write_kubeconfig(out / "kubeconfig")
            rport = free_port()
            argv = [sys.executable, "-m", "corral", "router", "--host", "127.0.0.1", "--port", str(rport)]
            argv += ["--discovery", "k8s", "--namespace", "default", "--selector", "app=vllm"]
            argv += ["--kubeconfig", str(kubeconfig), "--engine-port", str(port), "--policy", "round_robin"]
            argv += ["--workers", "1", "--log-level", "warning"]
            t0 = time.monotonic()
            router = spawn("router", argv, f"http://127.0.0.1:{rport}", {0} & cpus or cpus, out)
            while True:
                if router.popen.poll() is not None or time.monotonic() - t0 > 180:
                    raise SystemExit(f"the router did not route to every pod (see {out}/router.log)")
                try:
                    if routable(router.url) >= args.pods:
                        break
                except OSError:
                    pass
                time.sleep(0.2)
            print(f"{args.pods} pods routable {time.monotonic() - t0:.1f} s after the router started")
            churn = Churn(kube, args.pods)
            time.sleep(3)  # first scrapes settle
            results: dict[str, list[float]] = {}
            for label, rps, churning in (
                ("idle, no churn", 0.0, False),
                ("idle, churn", 0.0, True),
                (f"{args.rps:g} req/s, no churn", args.rps, False),
                (f"{args.rps:g} req/s, churn", args.rps, True),
            ):
                load1 = os.getloadavg()[0]
                results[label] = phase(router, args.seconds, churn if churning else None, args.rate, rps)
                med = statistics.median(results[label]) * 100
                mean = statistics.mean(results[label]) * 100
                print(
                    f"  {label:24} router CPU median {med:5.2f}%, mean {mean:5.2f}% of a core"
                    f"  (load avg {load1:.2f})"
                )
            final = routable(router.url)
        router.stop()
        engines.stop()
        answered: dict[str, list[float]] = orjson.loads((out / "engines.stats").read_bytes())
        late = sum(1 for ip, t in churn.gone.items() for s in answered.get(ip, []) if s > t + args.grace)
        any_after = sum(1 for ip, t in churn.gone.items() for s in answered.get(ip, []) if s > t)
        total = sum(len(v) for v in answered.values())
        print(f"chat completions answered: {total} by {len(answered)} addresses")
        print(f"events: {churn.events} ({dict(churn.kinds)}); routable at the end: {final}")
        print(
            f"requests answered by a removed pod's address: {late} after {args.grace:g} s, {any_after} at all"
        )
        for rps_label in ("idle", f"{args.rps:g} req/s"):
            base = statistics.median(results[f"{rps_label}, no churn"])
            with_ = statistics.median(results[f"{rps_label}, churn"])
            verdict = "met" if with_ - base < 0.05 else "NOT met"
            print(
                f"{rps_label:12} no churn {base * 100:5.2f}%  churn {with_ * 100:5.2f}%  "
                f"added {(with_ - base) * 100:+5.2f}% of a core ({with_ / max(base, 0.001):.2f}x); "
                f"target < 5%: {verdict}"
            )
    finally:
        if router is not None:
            router.stop()
        engines.stop()


if __name__ == "__main__":
    main()
