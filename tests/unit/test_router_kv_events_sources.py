"""Where the router learns an engine's KV-events address: its supervisor's state line (which wins), a
backends file's `kv_events=` marker, a pod's `corral.dev/kv-events` annotation; each reaches the
endpoint that membership builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.contracts.supervisor import StateLine
from corral.engine.kv_events_address import KvEventsAddress
from corral.pod_labels import KV_EVENTS_ANNOTATION
from corral.router.discovery.backends_file import BackendsFileError, parse_backends
from corral.router.discovery.k8s_pods import pod_view
from corral.router.discovery.kv_events_feed import kv_events_address
from corral.router.discovery.static import StaticSource
from corral.router.membership.consumer import MembershipConsumer
from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.membership.membership import Membership

FILE = Path("/etc/corral/backends")


def test_the_backends_file_marker_reaches_the_endpoint() -> None:
    backends = parse_backends(
        "http://10.0.0.1:8000 kv_events=tcp://*:5557,tcp://*:5558 role=both\nhttp://10.0.0.2:8000\n", FILE
    )
    assert backends.kv_events == {"http://10.0.0.1:8000": "tcp://*:5557,tcp://*:5558"}
    assert backends.roles == {"http://10.0.0.1:8000": "both"}
    membership = Membership()
    StaticSource(MembershipConsumer(membership), backends.urls, 5.0, kv_events=backends.kv_events)
    endpoint = membership.get("http://10.0.0.1:8000")
    assert endpoint is not None
    assert kv_events_address(endpoint) == KvEventsAddress("tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558")
    other = membership.get("http://10.0.0.2:8000")
    assert other is not None
    with pytest.raises(LookupError):
        kv_events_address(other)


@pytest.mark.parametrize("marker", ["kv_events=http://h:1", "kv_events=tcp://*:5557 kv_events=tcp://*:1"])
def test_a_bad_marker_is_named_with_its_line(marker: str) -> None:
    with pytest.raises(BackendsFileError, match=f"^{FILE}:1: "):
        parse_backends(f"http://10.0.0.1:8000 {marker}\n", FILE)


def test_a_pod_annotation_gives_the_address() -> None:
    body = {
        "metadata": {
            "namespace": "ns",
            "name": "p",
            "uid": "u",
            "annotations": {KV_EVENTS_ANNOTATION: "tcp://*:5557"},
        },
        "status": {
            "podIP": "10.0.0.9",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    assert pod_view(body).kv_events == "tcp://*:5557"


def test_the_supervisors_word_wins() -> None:
    line = StateLine.model_validate({"epoch": 1, "state": "READY", "kv_events": "tcp://10.0.0.3:6000"})
    assert line.kv_events == "tcp://10.0.0.3:6000"
    endpoint = Endpoint(
        "http://10.0.0.1:8000", kv_events="tcp://*:5557", supervisor=SupervisorView("http://s")
    )
    assert kv_events_address(endpoint).endpoint == "tcp://10.0.0.1:5557"
    assert endpoint.supervisor is not None
    endpoint.supervisor.kv_events = line.kv_events
    assert kv_events_address(endpoint).endpoint == "tcp://10.0.0.3:6000"
