"""The informer and the pod source against the fake API server over loopback HTTP, through the
real kubernetes-asyncio client: re-list after 410 (in-stream ERROR and HTTP 410), re-list after a
cut stream, the reconcile that removes an endpoint whose DELETE was never seen, the routability
rules (NotReady, evicted without IP, terminating), and removal never waiting for a slow probe."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from corral.engine_state import EngineState
from corral.fleet.local.ports import free_port
from corral.k8s.watch.client import KubePodApi
from corral.k8s.watch.informer import InformerConfig
from corral.router.discovery.k8s_pods import PodSource, PodSourceConfig
from corral.router.membership.consumer import MembershipConsumer
from corral.router.membership.membership import Membership
from corral.router.telemetry.metrics import RouterMetrics
from tests.support.fake_kube import FakeKube

NS = "serving"
LABELS = {"app": "vllm"}


def shared_port() -> int:
    """A port free on 127.0.0.1, used by every engine stub at its own 127.0.0.N address."""
    return free_port("127.0.0.1")


@dataclass
class Engines:
    """Tiny /v1/models servers at 127.0.0.N:port, each answering after its delay (3600: never);
    `answered` counts the answers each address gave."""

    port: int
    runners: list[web.AppRunner]
    delays: dict[str, float]
    answered: dict[str, int] = field(default_factory=dict)

    async def add(self, ip: str, delay: float = 0.0) -> None:
        self.delays[ip] = delay

        async def models(request: web.Request) -> web.Response:
            await asyncio.sleep(self.delays[ip])
            self.answered[ip] = self.answered.get(ip, 0) + 1
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

        app = web.Application()
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, ip, self.port).start()
        self.runners.append(runner)


@dataclass
class Rig:
    kube: FakeKube
    membership: Membership
    metrics: RouterMetrics
    source: PodSource
    engines: Engines

    def url(self, ip: str) -> str:
        return f"http://{ip}:{self.engines.port}"

    def state(self, ip: str) -> EngineState | None:
        e = self.membership.get(self.url(ip))
        return None if e is None else e.state

    def probe_handled(self, ip: str) -> bool:
        """The pod at `ip` was probed, its stub answered, and no worker holds (or waits for) its key:
        whatever the answer was going to do is done."""
        key = f"{NS}/vllm-{ip.rsplit('.', 1)[1]}"
        queue = self.source._queue
        return (
            self.engines.answered.get(ip, 0) >= 1
            and key not in queue.processing
            and queue.pending(key) is None
        )

    async def until(self, condition: Callable[[], bool], what: str, within: float = 10.0) -> None:
        for _ in range(int(within / 0.01)):
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"not within {within} s: {what}")


@pytest.fixture
async def rig(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    options = getattr(request, "param", {})
    kube = FakeKube()
    kube.bookmark_interval = 0.2
    await kube.start()
    engines = Engines(shared_port(), [], {})
    api = await KubePodApi.connect(NS, "app=vllm", str(kube.write_kubeconfig(tmp_path / "kubeconfig")))
    metrics = RouterMetrics()
    membership = Membership(on_exit=lambda r: metrics.count_removal(r.cause))
    config = PodSourceConfig(
        engine_port=engines.port,
        probe_timeout=options.get("probe_timeout", 5.0),
        probe_retry_seconds=0.2,
        workers=4,
        informer=InformerConfig(
            resync_seconds=options.get("resync", 60.0),
            watch_timeout_seconds=options.get("watch_timeout", 30),
            backoff_initial=0.05,
        ),
    )
    source = PodSource(MembershipConsumer(membership, metrics.removal_latency.observe), metrics, api, config)
    await source.start()
    try:
        yield Rig(kube, membership, metrics, source, engines)
    finally:
        await source.stop()
        for runner in engines.runners:
            await runner.cleanup()
        await kube.stop()


async def watching(rig: Rig) -> None:
    """Until the informer's watch is open on the server: READY pods may come from its list alone, with
    the watch that follows it not yet asked for."""
    await rig.until(lambda: len(rig.kube.watches) == 1, "the informer's watch open")


async def ready_pods(rig: Rig, *ips: str) -> None:
    for ip in ips:
        await rig.engines.add(ip)
        rig.kube.create_pod(f"vllm-{ip.rsplit('.', 1)[1]}", ip, NS, LABELS, port=rig.engines.port)
    await rig.until(lambda: all(rig.state(ip) is EngineState.READY for ip in ips), "pods READY")


async def test_ready_pods_become_endpoints_and_other_labels_do_not(rig: Rig) -> None:
    await rig.engines.add("127.0.0.12")
    rig.kube.create_pod("other", "127.0.0.12", NS, {"app": "web"})
    rig.kube.create_pod("elsewhere", "127.0.0.12", "default", LABELS)
    await ready_pods(rig, "127.0.0.10", "127.0.0.11")
    assert {e.name for e in rig.membership.endpoints()} == {f"{NS}/vllm-10", f"{NS}/vllm-11"}
    endpoint = rig.membership.get(rig.url("127.0.0.10"))
    assert endpoint is not None and endpoint.source == "k8s" and endpoint.models == {"m"}
    assert endpoint.last_event_version is not None
    # the watch asked for bookmarks and got them
    await rig.until(lambda: rig.metrics.membership_events.get(("k8s", "BOOKMARK"), 0) >= 1, "a BOOKMARK")
    kinds = [kind for kind, _ in rig.kube.requests]
    assert kinds[:2] == ["list", "watch"]
    watch = rig.kube.requests[1][1]
    assert watch["allowWatchBookmarks"] in ("true", "True", "1")
    assert watch["labelSelector"] == "app=vllm"
    assert int(watch["resourceVersion"]) >= 1000  # the list's version, not "" (which would replay all)


async def test_not_ready_evicted_and_terminating_pods_leave_routing_at_once(rig: Rig) -> None:
    ips = ("127.0.0.20", "127.0.0.21", "127.0.0.22", "127.0.0.23")
    await ready_pods(rig, *ips)
    rig.kube.set_ready("vllm-20", False, NS)
    rig.kube.evict("vllm-21", NS)
    rig.kube.mark_terminating("vllm-22", NS)
    rig.kube.delete_pod("vllm-23", NS)
    await rig.until(
        lambda: (
            rig.state(ips[0]) is EngineState.STARTING
            and rig.state(ips[1]) is None
            and rig.state(ips[2]) is EngineState.STOPPING
            and rig.state(ips[3]) is None
        ),
        "all four out of routing",
    )
    causes = {r.name: r.cause for r in rig.membership.exits}
    assert causes == {
        f"{NS}/vllm-20": "not_ready",
        f"{NS}/vllm-21": "no_ip",
        f"{NS}/vllm-22": "terminating",
        f"{NS}/vllm-23": "deleted",
    }
    assert rig.metrics.removal_latency.count == 4
    # Ready again: back in routing after /v1/models answers again
    rig.kube.set_ready("vllm-20", True, NS)
    await rig.until(lambda: rig.state(ips[0]) is EngineState.READY, "pod 20 READY again")


async def test_watch_expired_with_410_in_stream_relists_and_catches_a_delete_missed_meanwhile(
    rig: Rig,
) -> None:
    await ready_pods(rig, "127.0.0.30", "127.0.0.31")
    lists_before = rig.source.informer.lists
    # The delete is never delivered on the open stream, then history is compacted and the watch ends
    # with ERROR 410: only a re-list can reveal it.
    rig.kube.drop_events(lambda kind, pod: kind == "DELETED")
    rig.kube.delete_pod("vllm-31", NS)
    rig.kube.stop_dropping()
    rig.kube.expire_watches()
    await rig.until(lambda: rig.state("127.0.0.31") is None, "vllm-31 removed after the re-list")
    assert rig.source.informer.lists == lists_before + 1
    assert rig.metrics.relists.get("expired") == 1
    assert rig.state("127.0.0.30") is EngineState.READY
    assert [r.cause for r in rig.membership.exits] == ["absent_on_relist"]


async def test_watch_answered_http_410_after_a_cut_stream_relists(rig: Rig) -> None:
    await ready_pods(rig, "127.0.0.40", "127.0.0.41")
    await watching(rig)
    rig.kube.expired_as_http = True
    rig.kube.unavailable = True
    rig.kube.compact()
    assert rig.kube.cut_watches() == 1
    rig.kube.delete_pod("vllm-41", NS)  # while nobody watches
    rig.kube.create_pod("vllm-42", "127.0.0.42", NS, LABELS)
    await rig.engines.add("127.0.0.42")
    tries = len(rig.kube.requests)
    await rig.until(lambda: len(rig.kube.requests) >= tries + 2, "the informer asked twice during the outage")
    assert rig.state("127.0.0.41") is EngineState.READY  # nothing could tell it yet
    rig.kube.unavailable = False
    await rig.until(
        lambda: rig.state("127.0.0.41") is None and rig.state("127.0.0.42") is EngineState.READY,
        "re-list applied",
    )
    assert rig.metrics.relists.get("broken", 0) >= 1


@pytest.mark.parametrize("rig", [{"watch_timeout": 1}], indirect=True)
async def test_a_watch_the_server_ended_cleanly_resumes_from_its_version_without_a_relist(rig: Rig) -> None:
    await ready_pods(rig, "127.0.0.45", "127.0.0.46")
    await watching(rig)  # the delete comes on a watch, and the first watch is counted below
    lists = rig.source.informer.lists

    def watches_so_far() -> int:
        return sum(kind == "watch" for kind, _ in rig.kube.requests)

    before = watches_so_far()
    rig.kube.delete_pod("vllm-46", NS)
    # two streams ended by timeoutSeconds=1 since the delete: each ending opened the next watch
    await rig.until(lambda: watches_so_far() >= before + 2, "two more watches")
    assert rig.state("127.0.0.46") is None
    assert rig.source.informer.lists == lists
    watches = [q for kind, q in rig.kube.requests if kind == "watch"]
    assert len(watches) >= 3 and all(w["timeoutSeconds"] == "1" for w in watches)
    versions = [int(w["resourceVersion"]) for w in watches]
    assert versions == sorted(versions) and versions[-1] >= rig.kube.version - 0


@pytest.mark.parametrize("rig", [{"resync": 1.0}], indirect=True)
async def test_periodic_reconcile_removes_an_endpoint_whose_delete_was_never_seen(rig: Rig) -> None:
    await ready_pods(rig, "127.0.0.50", "127.0.0.51")
    rig.kube.drop_events(lambda kind, pod: kind == "DELETED" and pod["metadata"]["name"] == "vllm-51")
    rig.kube.delete_pod("vllm-51", NS)
    # the zombie stays until the reconcile: its exit's cause below says the re-list removed it, not
    # a DELETE event (a fixed sleep here checked that too, and raced the 1 s resync on a slow machine)
    await rig.until(lambda: rig.state("127.0.0.51") is None, "reconcile removed vllm-51", within=5)
    assert rig.metrics.relists.get("resync", 0) >= 1
    record = rig.membership.exits[-1]
    assert record.cause == "absent_on_relist" and record.name == f"{NS}/vllm-51"
    assert rig.state("127.0.0.50") is EngineState.READY


@pytest.mark.parametrize("rig", [{"probe_timeout": 30.0}], indirect=True)
async def test_a_hanging_models_probe_never_delays_another_pods_removal(rig: Rig) -> None:
    await ready_pods(rig, "127.0.0.60")
    await rig.engines.add("127.0.0.61", delay=3600)  # /v1/models never answers
    rig.kube.create_pod("vllm-61", "127.0.0.61", NS, LABELS)
    await rig.until(lambda: rig.state("127.0.0.61") is EngineState.STARTING, "hanging pod seen")
    rig.kube.delete_pod("vllm-60", NS)
    # long before the hanging probe's 30 s timeout
    await rig.until(lambda: rig.state("127.0.0.60") is None, "vllm-60 removed", within=10)
    assert rig.state("127.0.0.61") is EngineState.STARTING


async def test_a_probe_that_answers_after_the_pod_was_deleted_does_not_bring_it_back(rig: Rig) -> None:
    await rig.engines.add("127.0.0.70", delay=0.5)
    rig.kube.create_pod("vllm-70", "127.0.0.70", NS, LABELS)
    await rig.until(lambda: rig.state("127.0.0.70") is EngineState.STARTING, "pod seen")
    rig.kube.delete_pod("vllm-70", NS)
    await rig.until(lambda: rig.probe_handled("127.0.0.70"), "the probe answered, after the delete")
    assert rig.state("127.0.0.70") is None
    assert rig.membership.endpoints() == []
