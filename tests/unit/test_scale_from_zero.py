"""Scale from zero in the router (`router/datapath/wake_on_demand.py`) with a real routing table: the
hold queue's bound, the scale-up signal where no engine sleeps, `--wake-mode reject`; and the
desired-replica rule (`router/telemetry/scaling.py`) that docs/scaling.md states."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from corral.engine_state import EngineState
from corral.router.datapath.wake_on_demand import REJECT, WakeOnDemand, WakeSettings
from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.membership.membership import Membership
from corral.router.routing.load_board import LoadBoard
from corral.router.telemetry.metrics import RouterMetrics
from corral.router.telemetry.scaling import ModelLoad, ScalingCollector, ScalingTargets, desired_replicas
from tests.support.procs import free_port
from tests.support.prom import sample
from tests.unit.test_router_supervisor_stream import until

DOWN = "http://127.0.0.1:{}"  # a supervisor that does not listen: the wake call fails, logged


def table(state: EngineState) -> Membership:
    membership = Membership()
    view = SupervisorView(DOWN.format(free_port()), "connected", state=state, epoch=4)
    membership.add(
        Endpoint("http://10.0.0.1:8000", frozenset({"m"}), EngineState.READY, "ok", supervisor=view), "t"
    )
    return membership


async def test_the_hold_is_bounded_and_releases_every_request_once_an_engine_is_ready() -> None:
    membership, metrics = table(EngineState.SLEEPING), RouterMetrics()
    wake = WakeOnDemand(membership, lambda e: None, WakeSettings(30, max_held=2), metrics)
    held = [asyncio.create_task(wake.hold("m")) for _ in range(2)]
    await until(lambda: wake.held_now() == {"m": 2}, 5.0)
    assert wake.oldest_held_seconds()["m"] >= 0
    # the third finds the queue full: answered at once, nothing else held
    assert await wake.hold("m") == "2 requests already wait for an engine"
    assert metrics.no_engine_answers == {("m", "hold_full"): 1}
    assert metrics.held == {"m": 2}  # (each wake call here fails at once, so a later request asks again)
    membership.add(Endpoint("http://10.0.0.2:8000", frozenset({"m"}), EngineState.READY, "ok"), "t")
    assert await asyncio.wait_for(asyncio.gather(*held), 5.0) == [None, None]
    assert metrics.hold_outcomes == {("m", "served"): 2}
    assert wake.held_now() == {} and wake.oldest_held_seconds() == {}


async def test_a_model_with_no_engine_asleep_or_on_its_way_raises_one_scale_up_signal() -> None:
    membership, metrics = table(EngineState.FAILED), RouterMetrics()
    wake = WakeOnDemand(membership, lambda e: None, WakeSettings(30, mode=REJECT), metrics)
    assert await wake.hold("m") == "no engine is awake; one has been asked for"
    assert await wake.hold("m") is not None
    assert metrics.scale_up_signals == {"m": 1} and metrics.wakes == {}
    assert metrics.no_engine_answers == {("m", "mode_reject"): 2}
    assert wake.wanting() == {"m"}
    # an engine on its way is no reason to ask for another
    starting, quiet = table(EngineState.STARTING), RouterMetrics()
    assert await WakeOnDemand(starting, lambda e: None, WakeSettings(30, mode=REJECT), quiet).hold("m")
    assert quiet.scale_up_signals == {}


async def test_a_model_no_endpoint_serves_is_left_to_the_proxy() -> None:
    wake = WakeOnDemand(table(EngineState.SLEEPING), lambda e: None, WakeSettings(30), RouterMetrics())
    assert await wake.hold("other") is None


@pytest.mark.parametrize(
    ("mode", "max_held"), [("queue", 10), ("hold", 0), ("hold", 100_001), ("reject", -1)]
)
def test_wake_settings_refuse_values_out_of_bounds(mode: str, max_held: int) -> None:
    with pytest.raises(ValueError, match="wake"):
        WakeSettings(1.0, mode, max_held)


T = ScalingTargets(in_flight=8, waiting=2, kv_usage=0.8)


@pytest.mark.parametrize(
    ("load", "want"),
    [
        (ModelLoad(ready=0, in_flight=0, waiting=None, kv_usage=None, held=0, asleep=1), 0),  # idle: zero
        (ModelLoad(ready=0, in_flight=0, waiting=None, kv_usage=None, held=50, asleep=1), 1),  # from zero
        (ModelLoad(ready=2, in_flight=0, waiting=0, kv_usage=0.0, held=0, asleep=0), 1),  # never below 1
        (ModelLoad(ready=2, in_flight=16, waiting=None, kv_usage=None, held=0, asleep=0), 2),  # on target
        (ModelLoad(ready=2, in_flight=17, waiting=None, kv_usage=None, held=0, asleep=0), 3),  # just over
        (ModelLoad(ready=2, in_flight=4, waiting=6, kv_usage=0.2, held=0, asleep=0), 3),  # queue rules
        (ModelLoad(ready=4, in_flight=4, waiting=0, kv_usage=0.9, held=0, asleep=0), 5),  # KV rules
        (ModelLoad(ready=3, in_flight=400, waiting=90, kv_usage=1.0, held=0, asleep=0), 6),  # at most 2x
    ],
)
def test_the_desired_replica_rule(load: ModelLoad, want: int) -> None:
    assert desired_replicas(load, T) == want


async def test_the_routers_per_model_series_while_requests_wait_and_after() -> None:
    membership, metrics = table(EngineState.SLEEPING), RouterMetrics()
    wake = WakeOnDemand(membership, lambda e: None, WakeSettings(30), metrics)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        ScalingCollector(
            membership.endpoints,
            lambda model: len(membership.eligible(model)),
            LoadBoard(),
            wake.held_now,
            wake.oldest_held_seconds,
            T,
        )
    )

    def series() -> dict[str, float | None]:
        text = generate_latest(registry).decode()
        names = ("ready_engines", "asleep_engines", "held_requests", "desired_replicas", "in_flight")
        return {n: sample(text, f"corral_router_model_{n}", model="m") for n in names}

    held = [asyncio.create_task(wake.hold("m")) for _ in range(3)]
    await until(lambda: wake.held_now() == {"m": 3}, 5.0)
    assert series() == {
        "ready_engines": 0,
        "asleep_engines": 1,
        "held_requests": 3,
        "desired_replicas": 1,  # from zero: one engine asked for
        "in_flight": 0,
    }
    assert sample(generate_latest(registry).decode(), "corral_router_model_oldest_held_seconds", model="m")
    ready = Endpoint("http://10.0.0.2:8000", frozenset({"m"}), EngineState.READY, "ok")
    membership.add(ready, "t")
    await asyncio.wait_for(asyncio.gather(*held), 5.0)
    ready.in_flight = 17  # over 8 per engine: one engine wants two
    assert series() == {
        "ready_engines": 1,
        "asleep_engines": 1,
        "held_requests": 0,
        "desired_replicas": 2,
        "in_flight": 17,
    }
