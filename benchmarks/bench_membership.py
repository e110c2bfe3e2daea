"""Membership benchmark (not a test): how fast a removal reaches the routing table, and what
membership churn costs the data path.

Setup: 50 `corral sim` engines, each at its own loopback address 127.0.0.N on one port, listed as
pods by the fake Kubernetes API server (tests/support/fake_kube.py, in a thread of this process).

Measured:
  removal latency  from the API server's change (its commit time) to the endpoint leaving the
                   router's table (the router's exit record), both on CLOCK_MONOTONIC, which is
                   one clock for all processes of a Linux host; quiet, then under load; plus the
                   router's own histogram (event arrival -> out of the table)
  throughput       closed loop (default 32 clients, non-streaming) through `corral router` with
                   the 50 engines as a static --backend list, then as Kubernetes pods with a
                   membership event every 100 ms (a pod deleted, then re-created at its address)

Everything runs on loopback and stops by itself.
    .venv/bin/python benchmarks/bench_membership.py [--engines 50] [--seconds 15] [--clients 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tests.support.fake_kube import FakeKube, FakeKubeThread  # noqa: E402
from tests.support.procs import CorralProcess, free_port  # noqa: E402

from loadgen import Report, chat_body, run_closed_loop  # noqa: E402

NS = "bench"
LABELS = {"app": "vllm"}
SIM = ("--model", "sim-model", "--seed", "0", "--ttft-base-ms", "1", "--itl-ms", "1", "--max-num-seqs", "256")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10.0) as resp:
        return orjson.loads(resp.read())


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise SystemExit(f"bench_membership: timed out waiting for {what}")


def routable(router_url: str) -> int:
    return sum(1 for e in get_json(router_url + "/v1/fleet")["endpoints"] if e["routable"])


def start_router(args: list[str]) -> tuple[CorralProcess, str]:
    args = ["--workers", "1", *args]  # one router process, as this benchmark always measured
    port = free_port()
    proc = CorralProcess(
        ["router", "--port", str(port), "--policy", "least_request", "--log-level", "warning", *args]
    )
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    return proc, url


def load(router_url: str, name: str, clients: int, seconds: float) -> Report:
    return asyncio.run(
        run_closed_loop(
            name,
            [router_url + "/v1/chat/completions"],
            lambda i: chat_body("sim-model", False, 8, i),
            clients=clients,
            max_requests=10**7,
            max_seconds=seconds,
        )
    )


class Churner:
    """Every `period` seconds, one membership event: delete a pod, then re-create it at its address."""

    def __init__(self, api: FakeKubeThread, addresses: list[str], port: int, period: float) -> None:
        self.api = api
        self.addresses = addresses
        self.port = port
        self.period = period
        self.deleted: list[tuple[str, int]] = []  # (pod name, version of its deletion)
        self.events = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._generation = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        i = 0
        names = {ip: f"vllm-{ip.rsplit('.', 1)[1]}" for ip in self.addresses}
        while not self._stop.wait(self.period):
            ip = self.addresses[i % len(self.addresses)]
            name = names[ip]
            version = self.api.call(lambda k, name=name: k.delete_pod(name, NS))
            self.deleted.append((f"{NS}/{name}", version))
            self.events += 1
            if self._stop.wait(self.period):
                break
            self._generation += 1
            names[ip] = f"vllm-{ip.rsplit('.', 1)[1]}-g{self._generation}"
            self.api.call(lambda k, n=names[ip], ip=ip: k.create_pod(n, ip, NS, LABELS, port=self.port))
            self.events += 1
            i += 1


def removal_latencies(router_url: str, api: FakeKubeThread, deleted: list[tuple[str, int]]) -> list[float]:
    committed: dict[int, float] = api.call(lambda k: dict(k.committed_at))
    exits = get_json(router_url + "/v1/fleet")["left_routing"]
    by_version = {(e["name"], e["event_resource_version"]): e for e in exits}
    out = []
    for name, version in deleted:
        record = by_version.get((name, str(version)))
        if record is not None:
            out.append(record["at_monotonic"] - committed[version])
    return out


def router_histogram_mean(router_url: str) -> tuple[float, float]:
    with urllib.request.urlopen(router_url + "/metrics", timeout=10.0) as resp:
        text = resp.read().decode()
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("corral_router_removal_latency_seconds_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("corral_router_removal_latency_seconds_count"):
            count = float(line.rsplit(" ", 1)[1])
    return count, (total / count if count else float("nan"))


def describe(report: Report) -> str:
    s = report.summary()
    return (
        f"{s['requests']:7d} req  {s['errors']:4d} err  {s['rps']:8.1f} req/s  "
        f"p50 {s['p50_ms']:7.2f} ms  p99 {s['p99_ms']:7.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--engines", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each load run")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--removals", type=int, default=100, help="quiet removals to time")
    parser.add_argument("--period", type=float, default=0.1, help="seconds between membership events")
    args = parser.parse_args()
    if not 1 <= args.engines <= 200:
        raise SystemExit("--engines must be between 1 and 200")

    port = free_port()
    addresses = [f"127.0.0.{10 + n}" for n in range(args.engines)]
    print(f"starting {args.engines} simulators on 127.0.0.10..{9 + args.engines}:{port} ...", flush=True)
    sims = [CorralProcess(["sim", "--host", ip, "--port", str(port), *SIM]) for ip in addresses]
    routers: list[CorralProcess] = []
    results: dict[str, Any] = {}
    try:
        for ip, sim in zip(addresses, sims, strict=True):
            sim.wait_http(f"http://{ip}:{port}/health", timeout=120)

        # 1. static membership
        router, url = start_router([arg for ip in addresses for arg in ("--backend", f"http://{ip}:{port}")])
        routers.append(router)
        wait_for(lambda: routable(url) == args.engines, 60, "static endpoints")
        static = load(url, "static", args.clients, args.seconds)
        router.stop()
        print(f"static membership, {args.engines} endpoints:       {describe(static)}", flush=True)

        with FakeKubeThread() as api, tempfile.TemporaryDirectory() as tmp:
            kubeconfig = api.kube.write_kubeconfig(Path(tmp) / "kubeconfig", NS)

            def create_all(k: FakeKube) -> None:
                for ip in addresses:
                    k.create_pod(f"vllm-{ip.rsplit('.', 1)[1]}", ip, NS, LABELS, port=port)

            api.call(create_all)
            router, url = start_router(
                [
                    "--discovery", "k8s", "--namespace", NS, "--selector", "app=vllm",
                    "--kubeconfig", str(kubeconfig), "--engine-port", str(port),
                ]
            )  # fmt: skip
            routers.append(router)
            wait_for(lambda: routable(url) == args.engines, 60, "k8s endpoints")

            # 2. removal latency, quiet: delete a pod, wait until it is out, re-create it.
            quiet: list[tuple[str, int]] = []
            for i in range(args.removals):
                ip = addresses[i % len(addresses)]
                name = f"vllm-{ip.rsplit('.', 1)[1]}"
                quiet.append((f"{NS}/{name}", api.call(lambda k, name=name: k.delete_pod(name, NS))))
                wait_for(lambda: routable(url) == args.engines - 1, 10, "a removal")
                api.call(lambda k, name=name, ip=ip: k.create_pod(name, ip, NS, LABELS, port=port))
                wait_for(lambda: routable(url) == args.engines, 10, "a re-add")
            quiet_lat = removal_latencies(url, api, quiet)
            count, mean = router_histogram_mean(url)

            # 3. throughput with a membership event every `period` seconds
            churner = Churner(api, addresses, port, args.period)
            churner.start()
            churned = load(url, "k8s-churn", args.clients, args.seconds)
            churner.stop()
            busy_lat = removal_latencies(url, api, churner.deleted)
            count_all, mean_all = router_histogram_mean(url)
            router.stop()

        def ms(values: list[float], q: float) -> float:
            return round(quantile(values, q) * 1000, 3)

        print(
            f"k8s membership, event every {args.period * 1000:.0f} ms ({churner.events} events): "
            f"{describe(churned)}"
        )
        print(
            f"throughput, churn vs static: {churned.rps / static.rps * 100:.1f} %  "
            f"(p99 {churned.latency_ms(0.99):.2f} ms vs {static.latency_ms(0.99):.2f} ms)"
        )
        print(
            f"removal latency, API server change -> out of the table, quiet ({len(quiet_lat)}): "
            f"p50 {ms(quiet_lat, 0.5)} ms  p99 {ms(quiet_lat, 0.99)} ms  max {ms(quiet_lat, 1.0)} ms"
        )
        print(
            f"removal latency, same, under load ({len(busy_lat)}): "
            f"p50 {ms(busy_lat, 0.5)} ms  p99 {ms(busy_lat, 0.99)} ms  max {ms(busy_lat, 1.0)} ms"
        )
        print(
            f"router histogram, event arrival -> out of the table: quiet mean {mean * 1e6:.0f} us over "
            f"{count:.0f}; all mean {mean_all * 1e6:.0f} us over {count_all:.0f}"
        )
        results = {
            "engines": args.engines,
            "clients": args.clients,
            "seconds": args.seconds,
            "static": static.summary(),
            "k8s_churn": {**churned.summary(), "membership_events": churner.events},
            "removal_quiet_ms": {"n": len(quiet_lat), "p50": ms(quiet_lat, 0.5), "p99": ms(quiet_lat, 0.99)},
            "removal_under_load_ms": {
                "n": len(busy_lat),
                "p50": ms(busy_lat, 0.5),
                "p99": ms(busy_lat, 0.99),
            },
            "router_histogram_mean_us": {"quiet": mean * 1e6, "all": mean_all * 1e6},
            "stdev_quiet_ms": statistics.pstdev(quiet_lat) * 1000 if quiet_lat else None,
        }
        out = Path(__file__).resolve().parent / "out"
        out.mkdir(exist_ok=True)
        (out / "bench_membership.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    finally:
        for proc in routers:
            proc.stop(grace=5)
        for sim in sims:
            sim.stop(grace=2)


if __name__ == "__main__":
    main()
