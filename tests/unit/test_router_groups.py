"""Serving groups in the router: a group's members are routable only while the group is whole (its
declared size, every member READY, one bundle fingerprint); one member leaving takes every member out
in the same call, with an exit record each; engines without a group are unchanged. Also the group
markers of the backends file and of Kubernetes pods, and the rendered label."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from corral.engine_state import EngineState
from corral.k8s.render.budgets import derive
from corral.k8s.render.config_reading import parse_config
from corral.k8s.render.manifests import render
from corral.k8s.watch.client import PodList, WatchEvent
from corral.pod_labels import SERVING_GROUP_LABEL, SERVING_GROUP_SIZE_ANNOTATION
from corral.router.datapath.wake_on_demand import WakeOnDemand, WakeSettings
from corral.router.discovery import supervisor_stream
from corral.router.discovery.backends_file import BackendsFileError, parse_backends
from corral.router.discovery.k8s_pods import PodSource, PodSourceConfig, pod_view
from corral.router.discovery.supervisor_stream import SupervisorStreams
from corral.router.membership.consumer import MembershipConsumer
from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.membership.events import EndpointAdded, EndpointRemoved, EndpointUpdated
from corral.router.membership.group_tag import GroupTag, GroupTagError, group_tag
from corral.router.membership.membership import Membership
from corral.router.telemetry.metrics import RouterCollector, RouterMetrics
from tests.support.procs import free_port
from tests.unit.test_router_endpoint_identity import NoApi
from tests.unit.test_router_endpoint_identity import pod as identity_pod
from tests.unit.test_router_supervisor_stream import SETTINGS, FakeSupervisor, state_line, until

SEED = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "wait-for-kv-cache" / "corral.yaml"
G = GroupTag("g0", 2)
A, B, C = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"


def fleet(*members: tuple[str, GroupTag | None], supervised: bool = False) -> MembershipConsumer:
    consumer = MembershipConsumer(Membership())
    for url, group in members:
        sup = url.replace(":8000", ":9000") if supervised else None
        consumer.emit(
            EndpointAdded(url, url, source="test", reason="seen", origin=url, supervisor_url=sup, group=group)
        )
    return consumer


def ready(consumer: MembershipConsumer, url: str) -> None:
    consumer.emit(EndpointUpdated(url, "answered", state=EngineState.READY, models=frozenset({"m"})))


def supervisor_says(
    consumer: MembershipConsumer, url: str, state: EngineState, fingerprint: str | None = "f1", why: str = ""
) -> None:
    endpoint = consumer.membership.get(url)
    assert endpoint is not None and endpoint.supervisor is not None
    view = endpoint.supervisor
    view.link, view.state, view.reason, view.fingerprint = "connected", state, why, fingerprint
    view.epoch = (view.epoch or 0) + 1
    consumer.membership.supervisor_changed(url, cause=f"supervisor_{state.value.lower()}")


def eligible(consumer: MembershipConsumer) -> set[str]:
    return {e.url for e in consumer.membership.eligible("m")}


def test_a_group_is_routed_only_once_every_member_is_ready() -> None:
    consumer = fleet((A, G), (B, G))
    ready(consumer, A)
    assert eligible(consumer) == set()
    a = consumer.membership.get(A)
    assert a is not None and a.state is EngineState.READY  # its own state is kept
    assert a.routing_verdict(0.0) == f"not routable: group g0 out: member {B} STARTING (seen)"
    # the model stays known while its only group is out: clients get 503, not 404
    assert consumer.membership.knows("m")

    ready(consumer, B)
    assert eligible(consumer) == {A, B}
    assert consumer.membership.knows("m") and consumer.membership.ready_count() == 2


def test_one_member_failing_takes_the_whole_group_out_in_one_call_and_back() -> None:
    consumer = fleet((A, G), (B, G), (C, None), supervised=True)
    for url in (A, B, C):
        ready(consumer, url)
        supervisor_says(consumer, url, EngineState.READY)
    assert eligible(consumer) == {A, B, C}

    supervisor_says(consumer, B, EngineState.FAILED, why="rank 1 died")

    assert eligible(consumer) == {C}  # the engine outside the group is untouched
    exits = [(r.url, r.cause) for r in consumer.membership.exits]
    assert exits == [(B, "supervisor_failed"), (A, "group_out")]
    assert "member http://10.0.0.2:8000 FAILED" in consumer.membership.exits[-1].reason
    assert "rank 1 died" in consumer.membership.exits[-1].reason
    group = consumer.membership.groups.to_json()[0]
    assert group["name"] == "g0" and not group["whole"] and "rank 1 died" in group["why"]

    supervisor_says(consumer, B, EngineState.READY)
    assert eligible(consumer) == {A, B, C}
    assert consumer.membership.groups.to_json()[0]["whole"]


def test_members_on_different_bundles_are_not_routed() -> None:
    consumer = fleet((A, G), (B, G), supervised=True)
    for url in (A, B):
        ready(consumer, url)
    supervisor_says(consumer, A, EngineState.READY, fingerprint="f1")
    supervisor_says(consumer, B, EngineState.READY, fingerprint="f2")
    assert eligible(consumer) == set()
    a = consumer.membership.get(A)
    assert a is not None and a.group_out is not None and "different bundle fingerprints" in a.group_out

    supervisor_says(consumer, B, EngineState.READY, fingerprint="f1")
    assert eligible(consumer) == {A, B}


def test_a_removed_member_takes_its_group_out_and_says_why() -> None:
    consumer = fleet((A, G), (B, G))
    ready(consumer, A)
    ready(consumer, B)
    consumer.emit(EndpointRemoved(B, "pod ns/b deleted", cause="deleted"))
    assert eligible(consumer) == set()
    a = consumer.membership.get(A)
    assert a is not None
    assert a.group_out == f"group g0 out: 1 of 2 members known; member {B} left: pod ns/b deleted"
    assert [(r.url, r.cause) for r in consumer.membership.exits] == [(B, "deleted"), (A, "group_out")]
    assert consumer.membership.knows("m")  # known, not routable: a 503, not a 404


def test_too_many_members_or_sizes_that_disagree_keep_a_group_out() -> None:
    consumer = fleet((A, G), (B, G), (C, G))
    for url in (A, B, C):
        ready(consumer, url)
    assert eligible(consumer) == set()
    consumer = fleet((A, G), (B, GroupTag("g0", 3)))
    for url in (A, B):
        ready(consumer, url)
    a = consumer.membership.get(A)
    assert eligible(consumer) == set() and a is not None and "disagree on its size" in str(a.group_out)


def test_routing_never_picks_a_member_of_a_group_that_is_not_whole() -> None:
    """The rule, checked after each step of random event sequences on two groups and a loner."""
    groups = {A: G, B: G, C: GroupTag("g1", 1)}
    for seed in range(60):
        rng = random.Random(seed)
        consumer = fleet(*groups.items(), supervised=True)
        present = set(groups)
        for _ in range(40):
            url = rng.choice(sorted(groups))
            move = rng.choice(["ready", "failed", "fingerprint", "remove", "add", "lost"])
            if move == "remove" and url in present:
                consumer.emit(EndpointRemoved(url, "gone"))
                present.discard(url)
            elif move == "add" and url not in present:
                sup = url.replace(":8000", ":9000")
                consumer.emit(
                    EndpointAdded(url, url, "test", "seen", url, supervisor_url=sup, group=groups[url])
                )
                present.add(url)
            elif url in present and move == "lost":
                endpoint = consumer.membership.get(url)
                assert endpoint is not None and endpoint.supervisor is not None
                endpoint.supervisor.link = "lost"
                consumer.membership.supervisor_changed(url, "supervisor_stream_lost")
            elif url in present:
                ready(consumer, url)
                state = EngineState.FAILED if move == "failed" else EngineState.READY
                supervisor_says(consumer, url, state, "f2" if move == "fingerprint" else "f1")
            picked = eligible(consumer)
            for name in {t.name for t in groups.values()}:
                members = [consumer.membership.get(u) for u in present if groups[u].name == name]
                whole = (
                    len(members) == next(t.size for t in groups.values() if t.name == name)
                    and all(m is not None and m.state is EngineState.READY for m in members)
                    and len({m.supervisor.fingerprint for m in members if m and m.supervisor}) == 1
                )
                in_routing = {m.url for m in members if m is not None} & picked
                assert not in_routing or whole, (seed, name, in_routing)
                if whole:
                    assert in_routing == {m.url for m in members if m is not None}, (seed, name)


def test_the_backends_file_reads_group_markers_and_refuses_bad_ones(tmp_path: Path) -> None:
    text = "http://a:1=http://a:9 group=g0/2  # e0\nhttp://b:2=http://b:9 group=g0/2\nhttp://c:3\n"
    backends = parse_backends(text, tmp_path / "f")
    assert backends.urls == ["http://a:1", "http://b:2", "http://c:3"]
    assert backends.groups == {"http://a:1": G, "http://b:2": G}
    bad = {
        "http://a:1 group=g0": "not a group marker; write group=NAME/SIZE",
        "http://a:1 grp=g0/2": "not an engine",
        "http://a:1 group=g0/x": "size 'x' is not a whole number",
        "http://a:1 group=g0/0": "size 0 is below 1",
        "http://a:1 group=/2": "name '' is not usable",
        "http://a:1 group=g0/2 extra": "not a group marker",
        "http://a:1 group=g0/2\nhttp://b:2 group=g0/3": "f:2: group g0 is given size 3 here and 2 on line 1",
        "http://a:1 group=g0/1\nhttp://b:2 group=g0/1": "f:2: group g0 of size 1 has more members",
    }
    for line, message in bad.items():
        with pytest.raises(BackendsFileError, match=message):
            parse_backends(line, tmp_path / "f")


def test_group_tags_are_checked() -> None:
    assert group_tag("g-0.a_b", "3") == GroupTag("g-0.a_b", 3)
    for name, size in (("bad name", 2), ("g", -1), ("x" * 64, 2)):
        with pytest.raises(GroupTagError):
            group_tag(name, size)


def pod(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": "p",
            "uid": "u",
            "labels": labels,
            "annotations": annotations,
        },
        "status": {
            "podIP": "10.0.0.9",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_pods_carry_their_serving_group() -> None:
    view = pod_view(pod({SERVING_GROUP_LABEL: "g0"}, {SERVING_GROUP_SIZE_ANNOTATION: "2"}))
    assert view.group == G and view.blocker() is None
    assert pod_view(pod({}, {})).group is None
    # a group without a usable size keeps the pod out, with what to fix
    for notes in ({}, {SERVING_GROUP_SIZE_ANNOTATION: "two"}):
        blocked = pod_view(pod({SERVING_GROUP_LABEL: "g0"}, notes)).blocker()
        assert (
            blocked is not None and blocked[0] == "bad_group" and SERVING_GROUP_SIZE_ANNOTATION in blocked[1]
        )


def test_the_renderer_labels_the_pods_of_a_serving_group() -> None:
    data = yaml.safe_load(SEED.read_text(encoding="utf-8"))
    data["replicas"] = 2
    data.setdefault("engine", {})["serving_group"] = "g0"
    config = parse_config(data)
    objects = {m.filename: m.obj for m in render(config, derive(config))}
    template = objects["engine-deployment.yaml"]["spec"]["template"]["metadata"]
    assert template["labels"][SERVING_GROUP_LABEL] == "g0"
    assert template["annotations"][SERVING_GROUP_SIZE_ANNOTATION] == "2"
    assert pod_view({"metadata": template}).group == G  # what the router's k8s source reads back
    del data["engine"]["serving_group"]
    config = parse_config(data)
    plain = {m.filename: m.obj for m in render(config, derive(config))}
    assert (
        SERVING_GROUP_LABEL not in plain["engine-deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    )


def test_metrics_show_each_group_whole_or_not() -> None:
    consumer = fleet((A, G), (B, G))
    ready(consumer, A)
    collector = RouterCollector(RouterMetrics(), consumer.membership.endpoints)
    family = next(f for f in collector.collect() if f.name == "corral_router_serving_group_whole")
    assert [(s.labels, s.value) for s in family.samples] == [({"group": "g0"}, 0)]
    ready(consumer, B)
    family = next(f for f in collector.collect() if f.name == "corral_router_serving_group_whole")
    assert [(s.labels, s.value) for s in family.samples] == [({"group": "g0"}, 1)]


def test_an_endpoint_without_a_group_is_routed_as_before() -> None:
    endpoint = Endpoint(A, frozenset({"m"}), EngineState.READY, "ok")
    membership = Membership()
    membership.add(endpoint, "test")
    assert membership.eligible("m") == [endpoint] and endpoint.routable(0.0)
    assert membership.groups.to_json() == []


async def test_an_acknowledgement_waits_for_requests_picked_for_any_member_of_the_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member's removal is acknowledged only once every request picked for the rest of its group has
    reached its engine too: after the ack, nothing the router picked is still on its way to the group."""
    waits: list[tuple[list[str], asyncio.Event]] = []  # per acknowledgement begun: whom it waits for, ended
    real_wait = supervisor_stream._dispatched

    async def spied(endpoints: list[Endpoint], within: float) -> None:
        ended = asyncio.Event()
        waits.append(([e.url for e in endpoints], ended))  # looks at `dispatching` before any await
        await real_wait(endpoints, within)
        ended.set()

    monkeypatch.setattr(supervisor_stream, "_dispatched", spied)
    fakes = [FakeSupervisor(), FakeSupervisor()]
    membership = Membership()
    streams = SupervisorStreams(membership, RouterMetrics(), SETTINGS)
    for fake in fakes:
        await fake.start()
    await streams.start()
    try:
        scripts = [fake.script() for fake in fakes]
        members = [
            Endpoint(
                url, frozenset({"m"}), EngineState.READY, "ok", supervisor=SupervisorView(fake.url), group=G
            )
            for url, fake in ((A, fakes[0]), (B, fakes[1]))
        ]
        for member in members:
            membership.add(member, "test")
        for lines in scripts:
            lines.put_nowait({**state_line(3, "READY"), "fingerprint": "f1"})
        await until(lambda: {e.url for e in membership.eligible("m")} == {A, B})

        members[1].dispatching = 1  # a request picked for the peer, not yet answered by its engine
        scripts[0].put_nowait({**state_line(4, "FAILED"), "fingerprint": "f1"})
        await until(lambda: membership.eligible("m") == [])
        await until(lambda: len(waits) == 1)  # the acknowledgement began: its wait saw the peer's request
        (waited_for, ended) = waits[0]
        assert sorted(waited_for) == [A, B], "the wait covers the whole group"
        assert not ended.is_set(), "the wait ended while a request picked for the group had not arrived"
        assert fakes[0].acks == [], "acknowledged while a request picked for the group had not arrived"
        members[1].dispatching = 0
        await asyncio.wait_for(fakes[0].ack_seen.wait(), 1.0)
        (ack,) = fakes[0].acks
        assert ack["epoch"] == 4 and ack["undispatched"] == 0
        assert fakes[1].acks == []  # the peer's supervisor asked nothing: it is told nothing
    finally:
        await streams.stop()
        for fake in fakes:
            await fake.stop()


def test_pods_of_a_group_from_kubernetes_leave_routing_together() -> None:
    """`--discovery k8s`: pods labelled with one serving group are one group; a pod deleted takes the
    other out with it, and a pod of the group that comes back makes it whole again."""
    membership = Membership()
    pods = PodSource(
        MembershipConsumer(membership), RouterMetrics(), NoApi(), PodSourceConfig(supervisor_port=9)
    )
    marks = {"labels": {SERVING_GROUP_LABEL: "g0"}, "annotations": {SERVING_GROUP_SIZE_ANNOTATION: "2"}}

    def grouped(name: str, uid: str, ip: str, version: str = "1") -> dict[str, Any]:
        obj = identity_pod(name, uid, ip, version)
        obj["metadata"].update(marks)
        return dict(obj)

    def serve(url: str) -> None:
        endpoint = membership.get(url)
        assert endpoint is not None and endpoint.supervisor is not None and endpoint.group == G
        endpoint.supervisor.link, endpoint.supervisor.state = "connected", EngineState.READY
        membership.update(url, "probe answered", state=EngineState.READY, models=frozenset({"m"}))

    pods.replace(PodList([grouped("v-0", "u0", "10.0.0.1"), grouped("v-1", "u1", "10.0.0.2")], "1", 0.0))
    serve("http://10.0.0.1:8000")
    serve("http://10.0.0.2:8000")
    assert len(membership.eligible("m")) == 2

    pods.apply(WatchEvent("DELETED", grouped("v-1", "u1", "10.0.0.2", "2"), "2", time.monotonic()))
    assert membership.eligible("m") == []
    assert [(r.name, r.cause) for r in membership.exits] == [
        ("serving/v-1", "deleted"),
        ("serving/v-0", "group_out"),
    ]

    pods.apply(WatchEvent("ADDED", grouped("v-2", "u2", "10.0.0.3", "3"), "3", time.monotonic()))
    serve("http://10.0.0.3:8000")
    assert {e.url for e in membership.eligible("m")} == {"http://10.0.0.1:8000", "http://10.0.0.3:8000"}


async def test_wake_on_demand_wakes_every_sleeping_member_of_a_group() -> None:
    """A group is routed only whole, so waking one sleeping member of it would serve nothing."""
    woken: list[str] = []

    async def wake(request: web.Request) -> web.Response:
        woken.append((await request.json())["operation_id"])
        return web.json_response({"operation_id": "w"}, status=202)

    app = web.Application()
    app.router.add_post("/v1/wake", wake)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        membership = Membership()
        for epoch, url in ((2, A), (3, B)):
            view = SupervisorView(
                f"http://127.0.0.1:{port}", "connected", state=EngineState.SLEEPING, epoch=epoch
            )
            endpoint = Endpoint(url, frozenset({"m"}), EngineState.READY, "ok", supervisor=view, group=G)
            membership.add(endpoint, "test")
        await WakeOnDemand(membership, lambda e: None, WakeSettings(0.05), RouterMetrics()).hold("m")
        await until(lambda: len(woken) == 2, 5.0)
        assert sorted(woken) == ["wake-on-demand-2", "wake-on-demand-3"]
    finally:
        await runner.cleanup()
