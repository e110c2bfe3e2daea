"""The router's side of supervisor state streams: how the supervisor's view combines with the
membership source's (READY only when both say so on a live stream), and `SupervisorStreams` against
a scripted supervisor on loopback: a removal leaves the table before its acknowledgement is sent,
the acknowledgement waits for requests still being dispatched, a silent stream goes stale and a
closed one is lost (both unroutable, then reconnected), and a hung supervisor delays no other one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from corral.engine_state import EngineState
from corral.pod_labels import SUPERVISOR_PORT_ANNOTATION
from corral.router.discovery import supervisor_stream
from corral.router.discovery.k8s_pods import PodSource, PodSourceConfig, pod_view
from corral.router.discovery.supervisor_stream import StreamSettings, SupervisorStreams
from corral.router.membership.consumer import MembershipConsumer
from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.membership.membership import Membership
from corral.router.telemetry.metrics import RouterMetrics
from tests.support.procs import free_port

READY, DRAINING, STARTING = EngineState.READY, EngineState.DRAINING, EngineState.STARTING


def state_line(epoch: int, state: str, sub_state: str | None = None) -> dict[str, Any]:
    return {"type": "state", "epoch": epoch, "state": state, "sub_state": sub_state, "reason": "r", "time": 0}


# -- the combination rule ----------------------------------------------------------------------------


def supervised(source: EngineState, **view: Any) -> Endpoint:
    return Endpoint(
        "http://e", state=source, reason="source says", supervisor=SupervisorView("http://s", **view)
    )


def test_without_a_supervisor_the_source_decides() -> None:
    assert Endpoint("http://e", state=READY, reason="ok").effective() == (READY, "ok")


def test_a_supervised_endpoint_is_not_routable_before_its_stream_answers() -> None:
    endpoint = supervised(READY)
    assert endpoint.state is STARTING and "stream connecting" in endpoint.reason
    assert not endpoint.routable(time.monotonic())


def test_ready_needs_both_the_source_and_a_live_supervisor_stream() -> None:
    assert supervised(READY, link="connected", state=READY, epoch=3).state is READY
    assert supervised(STARTING, link="connected", state=READY, epoch=3).state is STARTING
    draining = supervised(READY, link="connected", state=DRAINING, sub_state="leaving_routing", epoch=4)
    assert draining.state is DRAINING and "leaving_routing at epoch 4" in draining.reason


def test_a_lost_or_stale_stream_keeps_the_last_state_but_never_ready() -> None:
    lost = supervised(READY, link="lost", link_reason="closed by the supervisor", state=READY, epoch=3)
    assert lost.state is STARTING
    assert "stream lost (closed by the supervisor); last said READY at epoch 3" in lost.reason
    stale = supervised(READY, link="stale", link_reason="no line", state=DRAINING, epoch=4)
    assert stale.state is DRAINING and "stream stale" in stale.reason


def test_membership_records_the_exit_when_the_supervisor_takes_an_endpoint_out() -> None:
    membership = Membership()
    endpoint = supervised(READY, link="connected", state=READY, epoch=3)
    endpoint.models = frozenset({"m"})
    membership.add(endpoint, "test")
    assert membership.eligible("m") == [endpoint]
    assert endpoint.supervisor is not None
    endpoint.supervisor.state = DRAINING
    membership.supervisor_changed(endpoint.url, cause="supervisor_draining")
    assert membership.eligible("m") == []
    assert [(x.kind, x.cause) for x in membership.exits] == [("unroutable", "supervisor_draining")]
    # the source's later "READY" (a /v1/models refresh) does not put it back
    membership.update(endpoint.url, "GET /v1/models answered", state=READY)
    assert membership.eligible("m") == []


# -- SupervisorStreams against a scripted supervisor -------------------------------------------------


class FakeSupervisor:
    """Serves /v1/state/watch from a script per connection and records /v1/acks."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections: list[dict[str, str]] = []
        self.scripts: asyncio.Queue[asyncio.Queue[dict[str, Any] | None]] = asyncio.Queue()
        self.acks: list[dict[str, Any]] = []
        self.ack_seen = asyncio.Event()
        self.hang = False
        self._runner: web.AppRunner | None = None

    def script(self) -> asyncio.Queue[dict[str, Any] | None]:
        """The lines (None: close) the next connection gets."""
        lines: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.scripts.put_nowait(lines)
        return lines

    async def watch(self, request: web.Request) -> web.StreamResponse:
        self.connections.append(dict(request.query))
        if self.hang:
            await asyncio.sleep(3600)
        lines = await self.scripts.get()
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        while (line := await lines.get()) is not None:
            await resp.write(orjson.dumps(line) + b"\n")
        return resp

    async def ack(self, request: web.Request) -> web.Response:
        self.acks.append(orjson.loads(await request.read()))
        self.ack_seen.set()
        return web.json_response({"ok": True})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/state/watch", self.watch)
        app.router.add_post("/v1/acks", self.ack)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


SETTINGS = StreamSettings(
    router_id="router-x", heartbeat_seconds=0.1, missed_heartbeats=3, backoff_initial=0.05, dispatch_wait=2.0
)


@pytest.fixture
async def rig() -> AsyncIterator[tuple[FakeSupervisor, Membership, SupervisorStreams]]:
    supervisor = FakeSupervisor()
    await supervisor.start()
    membership = Membership()
    streams = SupervisorStreams(membership, RouterMetrics(), SETTINGS)
    await streams.start()
    try:
        yield supervisor, membership, streams
    finally:
        await streams.stop()
        await supervisor.stop()


def add_endpoint(membership: Membership, supervisor_url: str, url: str = "http://engine") -> Endpoint:
    endpoint = Endpoint(
        url, frozenset({"m"}), READY, "models answered", supervisor=SupervisorView(supervisor_url)
    )
    membership.add(endpoint, "test")
    return endpoint


async def until(check: Any, within: float = 2.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.005)


async def test_a_removal_leaves_the_table_before_its_ack_which_waits_for_dispatching(
    rig: tuple[FakeSupervisor, Membership, SupervisorStreams], monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[asyncio.Event] = []  # one per acknowledgement begun: set once its dispatch wait ended
    real_wait = supervisor_stream._dispatched

    async def spied(endpoints: list[Endpoint], within: float) -> None:
        ended = asyncio.Event()
        waits.append(ended)  # an acknowledgement began; the wait looks at `dispatching` before any await
        await real_wait(endpoints, within)
        ended.set()

    monkeypatch.setattr(supervisor_stream, "_dispatched", spied)
    supervisor, membership, _ = rig
    lines = supervisor.script()
    endpoint = add_endpoint(membership, supervisor.url)
    lines.put_nowait(state_line(7, "READY"))
    await until(lambda: membership.eligible("m") == [endpoint])
    assert supervisor.connections[0] == {"router_id": "router-x", "heartbeat": "0.1"}
    assert supervisor.acks == []  # READY is not a removal

    endpoint.dispatching = 1  # a request picked before the removal, not yet answered by the engine
    lines.put_nowait(state_line(8, "DRAINING", "leaving_routing"))
    await until(lambda: membership.eligible("m") == [])
    await until(lambda: len(waits) == 1)
    assert not waits[0].is_set(), "the dispatch wait ended while a picked request had not reached the engine"
    assert supervisor.acks == [], "acknowledged while a picked request had not reached the engine"
    endpoint.dispatching = 0
    await asyncio.wait_for(supervisor.ack_seen.wait(), 1.0)
    (ack,) = supervisor.acks
    assert ack["router_id"] == "router-x" and ack["epoch"] == 8 and ack["state"] == "DRAINING"
    assert ack["undispatched"] == 0 and ack["removal_latency_s"] >= 0
    assert endpoint.supervisor is not None and endpoint.supervisor.acked_epoch == 8

    # later non-READY epochs of the same removal are not acknowledged again
    lines.put_nowait(state_line(9, "DRAINING", "waiting_in_flight"))
    await until(lambda: endpoint.supervisor is not None and endpoint.supervisor.epoch == 9)
    await asyncio.sleep(0)  # an acknowledgement is decided with the line: its task would start now
    assert len(waits) == 1 and len(supervisor.acks) == 1


async def test_a_silent_stream_goes_stale_unroutable_and_is_reconnected(
    rig: tuple[FakeSupervisor, Membership, SupervisorStreams],
) -> None:
    supervisor, membership, _ = rig
    first, second = supervisor.script(), supervisor.script()
    endpoint = add_endpoint(membership, supervisor.url)
    first.put_nowait(state_line(3, "READY"))  # then nothing, not even heartbeats
    await until(lambda: endpoint.state is READY)
    await until(lambda: endpoint.state is not READY, within=SETTINGS.stale_after + 1.0)
    assert endpoint.supervisor is not None and endpoint.supervisor.link == "stale"
    assert "last said READY at epoch 3" in endpoint.reason
    assert [(x.kind, x.cause) for x in membership.exits] == [("unroutable", "supervisor_stream_stale")]
    # the reconnect's first line is the current state again
    await until(lambda: len(supervisor.connections) == 2)
    second.put_nowait(state_line(3, "READY"))
    await until(lambda: endpoint.state is READY)


async def test_a_closed_stream_is_unroutable_at_once(
    rig: tuple[FakeSupervisor, Membership, SupervisorStreams],
) -> None:
    supervisor, membership, _ = rig
    lines = supervisor.script()
    supervisor.script()  # the reconnect: stays silent
    endpoint = add_endpoint(membership, supervisor.url)
    lines.put_nowait(state_line(3, "READY"))
    await until(lambda: endpoint.state is READY)
    lines.put_nowait(None)
    await until(lambda: endpoint.state is not READY, within=0.5)
    assert endpoint.supervisor is not None and endpoint.supervisor.link in ("lost", "connecting")


async def test_a_stream_that_joins_mid_drain_acknowledges_its_first_line(
    rig: tuple[FakeSupervisor, Membership, SupervisorStreams],
) -> None:
    supervisor, membership, _ = rig
    lines = supervisor.script()
    add_endpoint(membership, supervisor.url)
    lines.put_nowait(state_line(12, "DRAINING", "leaving_routing"))
    await asyncio.wait_for(supervisor.ack_seen.wait(), 1.0)
    assert supervisor.acks[0]["epoch"] == 12


async def test_a_return_to_ready_is_acknowledged_once_the_endpoint_is_back_in_routing(
    rig: tuple[FakeSupervisor, Membership, SupervisorStreams],
) -> None:
    """A wake's POSTCHECK waits for this: READY again after a removal within one stream is acknowledged
    with state READY, after the endpoint is eligible again; a stream's first READY line is not."""
    supervisor, membership, _ = rig
    lines = supervisor.script()
    endpoint = add_endpoint(membership, supervisor.url)
    lines.put_nowait(state_line(3, "SLEEPING"))
    await asyncio.wait_for(supervisor.ack_seen.wait(), 1.0)
    supervisor.ack_seen.clear()
    lines.put_nowait(state_line(4, "WAKING"))
    lines.put_nowait(state_line(5, "READY"))
    await asyncio.wait_for(supervisor.ack_seen.wait(), 1.0)
    assert [(a["epoch"], a["state"]) for a in supervisor.acks] == [(3, "SLEEPING"), (5, "READY")]
    assert membership.eligible("m") == [endpoint]
    assert endpoint.supervisor is not None and endpoint.supervisor.acked_epoch == 5


async def test_operation_lines_show_the_runbook_step_and_never_move_routing(
    rig: tuple[FakeSupervisor, Membership, SupervisorStreams],
) -> None:
    supervisor, membership, _ = rig
    lines = supervisor.script()
    endpoint = add_endpoint(membership, supervisor.url)
    view = endpoint.supervisor
    assert view is not None
    lines.put_nowait(state_line(5, "READY"))  # a supervisor before issue 18: no operation field
    await until(lambda: endpoint.state is READY)
    assert view.operation is None and view.to_json(time.monotonic())["operation"] is None
    step = {"kind": "sleep", "id": None, "detail": "level 1", "step": "precheck", "since": 1.0}
    lines.put_nowait({"type": "operation", "epoch": 5, "time": 1.0, "operation": step})
    await until(lambda: view.operation is not None)
    assert membership.eligible("m") == [endpoint] and supervisor.acks == []  # shown, not routed on
    draining = {**step, "id": "op-1", "step": "drain_policy", "since": 2.0}
    lines.put_nowait({**state_line(6, "DRAINING", "leaving_routing"), "operation": draining})
    await until(lambda: membership.eligible("m") == [])
    assert view.to_json(time.monotonic())["operation"] == draining
    lines.put_nowait({"type": "operation", "epoch": 6, "time": 3.0, "operation": None})
    await until(lambda: view.operation is None)
    # each step begun and the end, once, kept for the dashboard's recent events (the state line that
    # carried the drain step is the one step heard there)
    kept = membership.operation_steps.to_json()
    assert [(s["step"], s["ended"]) for s in kept] == [
        ("precheck", False),
        ("drain_policy", False),
        (None, True),
    ]
    assert all(s["url"] == endpoint.url and s["kind"] == "sleep" for s in kept)


async def test_a_hung_supervisor_does_not_delay_another(
    rig: tuple[FakeSupervisor, Membership, SupervisorStreams],
) -> None:
    good, membership, _ = rig
    hung = FakeSupervisor()
    hung.hang = True
    await hung.start()
    try:
        stuck = add_endpoint(membership, hung.url, "http://stuck")
        lines = good.script()
        fine = add_endpoint(membership, good.url, "http://fine")
        lines.put_nowait(state_line(1, "READY"))
        await until(lambda: fine.state is READY, within=0.5)
        assert stuck.state is STARTING
        membership.remove("http://stuck", "test over")  # unwatch cancels the hung subscription
    finally:
        await hung.stop()


# -- Kubernetes: where a pod's supervisor is ---------------------------------------------------------


def pod(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": annotations or {}},
        "status": {
            "podIP": "10.0.0.7",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_a_pod_names_its_supervisor_port_in_an_annotation_or_the_flag_gives_it() -> None:
    membership, metrics = Membership(), RouterMetrics()
    flag = PodSource(MembershipConsumer(membership), metrics, None, PodSourceConfig(supervisor_port=8081))  # type: ignore[arg-type]
    plain = PodSource(MembershipConsumer(membership), metrics, None, PodSourceConfig())  # type: ignore[arg-type]
    annotated = pod_view(pod({SUPERVISOR_PORT_ANNOTATION: "9090"}))
    assert annotated.supervisor_port == 9090
    assert pod_view(pod({SUPERVISOR_PORT_ANNOTATION: "not-a-port"})).supervisor_port is None
    view = flag._supervisor_of(annotated)
    assert view is not None and view.url == "http://10.0.0.7:9090"
    view = flag._supervisor_of(pod_view(pod()))
    assert view is not None and view.url == "http://10.0.0.7:8081"
    assert plain._supervisor_of(pod_view(pod())) is None
