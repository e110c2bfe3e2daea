"""An endpoint is the thing it runs in, not its address: a pod replaced by a new one (a new UID) at
the same IP, or a new pod given a deleted pod's IP, is a new endpoint that inherits no ejection or
acknowledgement state; the same pod reported twice is one endpoint."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from corral.engine_state import EngineState
from corral.k8s.watch.client import PodList, WatchEvent
from corral.router.discovery.k8s_pods import PodSource, PodSourceConfig
from corral.router.membership.consumer import MembershipConsumer
from corral.router.membership.membership import Membership
from corral.router.telemetry.metrics import RouterMetrics

NS = "serving"
URL = "http://10.0.0.5:8000"


class NoApi:
    """The pod source's API is only used once started; these tests feed it events directly."""

    async def list_pods(self) -> PodList:
        raise AssertionError("not started")

    def watch_pods(self, resource_version: str, timeout_seconds: int) -> AsyncIterator[WatchEvent]:
        raise AssertionError("not started")

    async def close(self) -> None:
        return None


def pod(name: str, uid: str, ip: str = "10.0.0.5", version: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"namespace": NS, "name": name, "uid": uid, "resourceVersion": version},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def source() -> tuple[PodSource, Membership]:
    membership = Membership()
    consumer = MembershipConsumer(membership)
    return PodSource(consumer, RouterMetrics(), NoApi(), PodSourceConfig(supervisor_port=8001)), membership


def ready_and_marked(pods: PodSource, membership: Membership) -> None:
    """The endpoint at URL answered /v1/models, then failed a request (ejected) and acknowledged an epoch."""
    endpoint = membership.get(URL)
    assert endpoint is not None and endpoint.supervisor is not None
    view = endpoint.supervisor
    view.link, view.state, view.epoch, view.acked_epoch = "connected", EngineState.READY, 7, 7
    membership.update(URL, "probe answered", state=EngineState.READY, models=frozenset({"m"}))
    pods._answered.add(f"{NS}/vllm-0")  # what its own /v1/models probe would have recorded
    assert endpoint.state is EngineState.READY
    endpoint.eject(time.monotonic(), 30.0)
    assert endpoint.is_ejected(time.monotonic())


def test_a_pod_recreated_under_the_same_name_and_ip_is_a_new_endpoint() -> None:
    """A StatefulSet pod deleted and recreated while the watch was down: the re-list shows the same
    name and IP with a new UID. Nothing of the old pod's endpoint may carry over."""
    pods, membership = source()
    pods.replace(PodList([pod("vllm-0", uid="uid-a")], "1", time.monotonic()))
    old = membership.get(URL)
    ready_and_marked(pods, membership)

    pods.replace(PodList([pod("vllm-0", uid="uid-b", version="2")], "2", time.monotonic()))

    new = membership.get(URL)
    assert new is not None and new is not old
    assert not new.is_ejected(time.monotonic())
    assert new.supervisor is not None and new.supervisor.acked_epoch is None
    assert new.state is EngineState.STARTING  # it must answer /v1/models itself
    assert [(r.name, r.kind, r.cause) for r in membership.exits] == [
        (f"{NS}/vllm-0", "removed", "pod_replaced")
    ]


def test_a_new_pod_given_a_deleted_pods_ip_is_a_new_endpoint() -> None:
    pods, membership = source()
    pods.apply(WatchEvent("ADDED", pod("vllm-0", uid="uid-a"), "1", time.monotonic()))
    old = membership.get(URL)
    ready_and_marked(pods, membership)

    pods.apply(WatchEvent("DELETED", pod("vllm-0", uid="uid-a", version="2"), "2", time.monotonic()))
    pods.apply(WatchEvent("ADDED", pod("vllm-1", uid="uid-b", version="3"), "3", time.monotonic()))

    new = membership.get(URL)
    assert new is not None and new is not old and new.name == f"{NS}/vllm-1"
    assert not new.is_ejected(time.monotonic())
    assert new.supervisor is not None and new.supervisor.acked_epoch is None


def test_the_same_pod_added_twice_is_one_endpoint() -> None:
    pods, membership = source()
    added = WatchEvent("ADDED", pod("vllm-0", uid="uid-a"), "1", time.monotonic())
    pods.apply(added)
    first = membership.get(URL)
    ready_and_marked(pods, membership)

    pods.apply(added)  # the same pod again: a re-list replaying what the watch already said
    pods.replace(PodList([pod("vllm-0", uid="uid-a")], "1", time.monotonic()))

    assert membership.endpoints() == [first]
    assert (
        first is not None
        and first.state is EngineState.READY
        and first.supervisor is not None
        and first.supervisor.acked_epoch == 7
    )
    assert first.is_ejected(time.monotonic())
    assert list(membership.exits) == []
