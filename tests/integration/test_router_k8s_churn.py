"""Kubernetes membership under churn, with real processes on loopback: `corral router --discovery
k8s` watches the fake API server, which lists `corral sim` processes as pods, while 24 clients
send requests through the router without pause.

Each pod has its own loopback address, podIP 127.0.0.N, and its simulator listens on
127.0.0.N:<engine port> (all of 127.0.0.0/8 is loopback on Linux), so every pod is a distinct
endpoint at one `--engine-port`, as on a cluster.

The churn: a pod deleted; one made NotReady; one evicted (no IP); one deleted while the watch
stream is cut and the API server is down; one deleted while another pod's /v1/models hangs; a
terminating-then-deleted pod with events delayed; a DELETE lost and the watch expired with 410;
a DELETE lost with no error at all (only the periodic reconcile finds it). Simulators are never
stopped: a router that kept routing to a removed pod would get answers, so "zero requests after
removal" is checked on the simulators' side — each one's count of admitted requests
(`vllm:request_queue_time_seconds_count`) at the end must not exceed the number of requests the
router had sent it when its removal was applied (`requests_sent` in the exit record the router
keeps in /v1/fleet). A request the router sent after removal makes that fail.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.integration.test_router_failures import one_request
from tests.support.fake_kube import FakeKube, FakeKubeThread
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until

NS = "churn"
LABELS = {"app": "vllm"}
SIM = (
    "--model",
    "sim-model",
    "--seed",
    "0",
    "--ttft-base-ms",
    "20",
    "--itl-ms",
    "5",
    "--max-num-seqs",
    "256",
)
CLIENTS = 24
FIRST, SPARES = range(10, 16), range(16, 22)
HANGING_IP = "127.0.0.99"


def ip(n: int) -> str:
    return f"127.0.0.{n}"


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5.0) as resp:
        return orjson.loads(resp.read())


def admitted(sim_url: str) -> float:
    """Requests the simulator admitted (counted on arrival, before any token)."""
    with urllib.request.urlopen(sim_url + "/metrics", timeout=5.0) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("vllm:request_queue_time_seconds_count"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{sim_url}/metrics has no vllm:request_queue_time_seconds_count")


def metrics_page(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5.0) as resp:
        return str(resp.read().decode())


def router_histogram(url: str, name: str) -> tuple[list[tuple[float, float]], float, float]:
    text = metrics_page(url)
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith(name + "_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
        elif line.startswith(name + "_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count"):
            count = float(line.rsplit(" ", 1)[1])
    return buckets, total, count


@pytest.fixture
def hanging_listener() -> Iterator[Callable[[int], None]]:
    """A socket at 127.0.0.99 that accepts connections and never answers: /v1/models hangs there."""
    sockets: list[socket.socket] = []

    def listen(port: int) -> None:
        s = socket.socket()
        s.bind((HANGING_IP, port))
        s.listen(64)
        sockets.append(s)

    yield listen
    for s in sockets:
        s.close()


async def test_churn_under_load_fails_nothing_and_sends_nothing_to_removed_pods(
    tmp_path: Path, hanging_listener: Callable[[int], None]
) -> None:
    engine_port = free_port()
    sims = {
        n: CorralProcess(["sim", "--host", ip(n), "--port", str(engine_port), *SIM])
        for n in (*FIRST, *SPARES)
    }
    sim_urls = {n: f"http://{ip(n)}:{engine_port}" for n in sims}
    hanging_listener(engine_port)
    router: CorralProcess | None = None
    with FakeKubeThread() as api:
        kube: Callable[[Callable[[FakeKube], Any]], Any] = api.call
        try:
            for n, proc in sims.items():
                proc.wait_http(sim_urls[n] + "/health")
            kubeconfig = api.kube.write_kubeconfig(tmp_path / "kubeconfig", NS)
            for n in FIRST:
                kube(lambda k, n=n: k.create_pod(f"vllm-{n}", ip(n), NS, LABELS, port=engine_port))
            port = free_port()
            router_url = f"http://127.0.0.1:{port}"
            router = CorralProcess(
                [
                    "router", "--port", str(port), "--discovery", "k8s", "--namespace", NS,
                    "--selector", "app=vllm", "--kubeconfig", str(kubeconfig),
                    "--engine-port", str(engine_port), "--policy", "least_request",
                    "--k8s-resync-seconds", "5", "--probe-timeout", "1", "--log-level", "info",
                ]
            )  # fmt: skip
            router.wait_http(router_url + "/health")

            def routable() -> set[str]:
                return {e["name"] for e in get_json(router_url + "/v1/fleet")["endpoints"] if e["routable"]}

            wait_until(lambda: len(routable()) == len(FIRST), 20, "the first pods routable")

            removal_versions: dict[str, int] = {}  # pod -> version of the change that removes it

            def remove(name: str, action: Callable[[FakeKube], int]) -> None:
                removal_versions[f"{NS}/{name}"] = kube(action)

            def add(n: int) -> None:
                kube(lambda k: k.create_pod(f"vllm-{n}", ip(n), NS, LABELS, port=engine_port))

            def gone(name: str) -> Callable[[], bool]:
                return lambda: f"{NS}/{name}" not in routable()

            def churn() -> None:
                pause = 2.5
                time.sleep(pause)
                remove("vllm-10", lambda k: k.delete_pod("vllm-10", NS))
                add(16)
                time.sleep(pause)
                remove("vllm-11", lambda k: k.set_ready("vllm-11", False, NS))
                add(17)
                time.sleep(pause)
                remove("vllm-12", lambda k: k.evict("vllm-12", NS))
                add(18)
                time.sleep(pause)
                # The watch is cut and the API server is down while vllm-13 is deleted.
                kube(lambda k: setattr(k, "unavailable", True) or k.cut_watches())
                remove("vllm-13", lambda k: k.delete_pod("vllm-13", NS))
                time.sleep(1.0)
                kube(lambda k: setattr(k, "unavailable", False))
                add(19)
                wait_until(gone("vllm-13"), 15, "vllm-13 removed after the outage")
                time.sleep(pause)
                # A pod whose /v1/models hangs, then another pod deleted while that probe waits.
                kube(lambda k: k.create_pod("vllm-hang", HANGING_IP, NS, LABELS, port=engine_port))
                time.sleep(0.3)
                remove("vllm-14", lambda k: k.delete_pod("vllm-14", NS))
                add(20)
                time.sleep(pause)
                # Events delayed by the API server: a pod marked terminating, then deleted.
                kube(lambda k: setattr(k, "event_delay", 0.5))
                remove("vllm-15", lambda k: k.mark_terminating("vllm-15", NS))
                time.sleep(0.5)
                kube(lambda k: k.delete_pod("vllm-15", NS))
                time.sleep(1.0)
                kube(lambda k: setattr(k, "event_delay", 0.0))
                add(21)
                time.sleep(pause)
                # vllm-16's DELETE is lost and the watch then expires with 410: the re-list finds it.
                kube(lambda k: k.drop_events(lambda kind, pod: pod["metadata"]["name"] == "vllm-16"))
                remove("vllm-16", lambda k: k.delete_pod("vllm-16", NS))
                kube(lambda k: k.stop_dropping() or k.expire_watches())
                wait_until(gone("vllm-16"), 15, "vllm-16 removed after the 410 re-list")
                time.sleep(pause)
                # vllm-17's DELETE is lost with no error at all: only the periodic reconcile finds it.
                kube(lambda k: k.drop_events(lambda kind, pod: pod["metadata"]["name"] == "vllm-17"))
                remove("vllm-17-delete", lambda k: k.delete_pod("vllm-17", NS))
                kube(lambda k: k.stop_dropping())
                wait_until(gone("vllm-17"), 15, "vllm-17 removed by the periodic reconcile")
                time.sleep(pause)

            results: list[str] = []
            stop = asyncio.Event()
            started = time.monotonic()
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                counter = iter(range(10**9))

                async def client() -> None:
                    for i in counter:
                        if stop.is_set():
                            return
                        results.append(await one_request(session, router_url, stream=i % 2 == 0, i=i))

                clients = [asyncio.create_task(client()) for _ in range(CLIENTS)]
                try:
                    await asyncio.wait_for(asyncio.to_thread(churn), timeout=80)
                finally:
                    stop.set()
                    await asyncio.wait_for(asyncio.gather(*clients), timeout=30)
            elapsed = time.monotonic() - started

            fleet = get_json(router_url + "/v1/fleet")
            outcome = Counter(results)
            failed = [r for r in results if r != "ok"]

            # Exit records: the first time each pod's endpoint left routing.
            first_exit: dict[str, dict[str, Any]] = {}
            for record in fleet["left_routing"]:
                first_exit.setdefault(record["name"], record)
            expected_causes = {
                "vllm-10": "deleted",
                "vllm-11": "not_ready",
                "vllm-12": "no_ip",
                "vllm-13": "absent_on_relist",  # the stream broke: the re-list found it gone
                "vllm-14": "deleted",
                "vllm-15": "terminating",
                "vllm-16": "absent_on_relist",
                "vllm-17": "absent_on_relist",
            }
            causes = {name.split("/")[1]: first_exit[name]["cause"] for name in first_exit}
            pods_left = {name: causes.get(name) for name in expected_causes}

            # Zero requests after removal, on the simulators' side.
            arrivals: list[tuple[str, int, float]] = []
            for name in expected_causes:
                n = int(name.split("-")[1])
                record = first_exit[f"{NS}/{name}"]
                arrivals.append((name, record["requests_sent"], admitted(sim_urls[n])))

            # Removal latency, end to end: the API server's change to the router's table.
            committed = api.call(lambda k: dict(k.committed_at))
            latencies = []
            for pod, version in removal_versions.items():
                name = pod.removesuffix("-delete")
                record = first_exit.get(name)
                if record is not None:
                    latencies.append((pod.split("/")[1], record["at_monotonic"] - committed[version]))
            buckets, total, count = router_histogram(router_url, "corral_router_removal_latency_seconds")
            metrics_text = metrics_page(router_url)

            print(
                f"\nchurn: {len(results)} requests in {elapsed:.1f} s from {CLIENTS} clients: {dict(outcome)}"
            )
            print("removal, API server change -> out of the router's table (s), by pod:")
            for pod, seconds in latencies:
                print(f"  {pod:16s} {seconds * 1000:9.1f} ms  ({causes.get(pod.removesuffix('-delete'))})")
            values = sorted(s for _, s in latencies)
            print(
                f"  end to end: p50 {statistics.median(values) * 1000:.1f} ms, "
                f"max {values[-1] * 1000:.1f} ms over {len(values)} removals "
                "(the lost DELETEs wait for a re-list; delayed events include the 0.5 s delay)"
            )
            print(
                f"router histogram (event arrival -> out of the table): {count:.0f} removals, "
                f"mean {total / max(count, 1) * 1e6:.0f} us, buckets {buckets}"
            )
            print("per removed pod: requests sent by the router before removal vs admitted by its sim:")
            for name, sent, seen in arrivals:
                print(f"  {name}: sent {sent}, admitted {seen:.0f}")
            print(
                "\n".join(
                    line
                    for line in metrics_text.splitlines()
                    if "membership_events" in line or "relists" in line
                )
            )

            assert failed == [], outcome
            assert len(results) > 1000
            assert pods_left == expected_causes
            for name, sent, seen in arrivals:
                assert seen <= sent, f"{name} admitted {seen} requests, router had sent {sent} at removal"
                assert sent > 0, f"{name} had served nothing before removal: the check would be vacuous"
            # the still-routable pods kept serving
            remaining = {e["name"] for e in fleet["endpoints"] if e["routable"]}
            assert remaining == {f"{NS}/vllm-{n}" for n in (18, 19, 20, 21)}
            hang = [e for e in fleet["endpoints"] if e["name"] == f"{NS}/vllm-hang"]
            assert hang and hang[0]["routable"] is False and hang[0]["state"] == "STARTING"
            for e in fleet["endpoints"]:
                assert e["source"] == "k8s" and e["last_event_resource_version"] and e["why"]
        finally:
            if router is not None:
                router.stop()
            for proc in sims.values():
                proc.stop(grace=2)
