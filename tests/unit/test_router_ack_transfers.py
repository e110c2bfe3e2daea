"""A router acknowledging the removal of a prefill engine waits, after its dispatches, until the decode
legs it started from that engine's KV transfers have reached their decode engine (`transfers_pending`),
bounded by `transfer_wait`, and says how many it could not confirm (`transfers_unconfirmed`); the
supervisor keeps that figure with the acknowledgement."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from corral.contracts.supervisor import AckRequest
from corral.router.discovery import supervisor_stream
from corral.router.discovery.supervisor_stream import SupervisorStreams
from corral.router.membership.endpoint import Endpoint
from corral.router.membership.membership import Membership
from corral.router.telemetry.metrics import RouterMetrics
from corral.supervisor.lifecycle.routers import RouterSubscriptions
from tests.unit.test_router_supervisor_stream import SETTINGS, FakeSupervisor, add_endpoint, state_line, until


async def rig_with(transfer_wait: float) -> tuple[FakeSupervisor, Membership, SupervisorStreams]:
    supervisor = FakeSupervisor()
    await supervisor.start()
    membership = Membership()
    settings = dataclasses.replace(SETTINGS, transfer_wait=transfer_wait)
    streams = SupervisorStreams(membership, RouterMetrics(), settings)
    await streams.start()
    return supervisor, membership, streams


@pytest.fixture
async def rigs() -> AsyncIterator[list[tuple[FakeSupervisor, Membership, SupervisorStreams]]]:
    made: list[tuple[FakeSupervisor, Membership, SupervisorStreams]] = []
    yield made
    for supervisor, _, streams in made:
        await streams.stop()
        await supervisor.stop()


async def test_the_ack_waits_for_decode_legs_from_the_engines_transfers(
    rigs: list[tuple[FakeSupervisor, Membership, SupervisorStreams]], monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting, returned = asyncio.Event(), asyncio.Event()
    real_wait = supervisor_stream._transfers_reached

    async def spied(endpoints: list[Endpoint], within: float) -> None:
        waiting.set()  # the acknowledgement has reached its wait for the transfers ...
        await real_wait(endpoints, within)  # ... whose first look at them comes before any await
        returned.set()

    monkeypatch.setattr(supervisor_stream, "_transfers_reached", spied)
    rigs.append(await rig_with(transfer_wait=5.0))
    supervisor, membership, _ = rigs[0]
    lines = supervisor.script()
    endpoint = add_endpoint(membership, supervisor.url)
    lines.put_nowait(state_line(7, "READY"))
    await until(lambda: membership.eligible("m") == [endpoint])
    endpoint.transfers_pending = 1  # a prefill answered here; its decode leg has no first byte yet
    lines.put_nowait(state_line(8, "DRAINING", "leaving_routing"))
    await until(lambda: membership.eligible("m") == [])
    await asyncio.wait_for(waiting.wait(), 10)
    assert not returned.is_set(), "the wait ended while a decode leg was still pending"
    assert supervisor.acks == [], "acknowledged while a decode leg from its transfer had not reached decode"
    endpoint.transfers_pending = 0
    await asyncio.wait_for(supervisor.ack_seen.wait(), 1.0)
    (ack,) = supervisor.acks
    assert ack["epoch"] == 8 and ack["transfers_unconfirmed"] == 0


async def test_past_its_bound_the_ack_names_the_transfers_it_could_not_confirm(
    rigs: list[tuple[FakeSupervisor, Membership, SupervisorStreams]],
) -> None:
    rigs.append(await rig_with(transfer_wait=0.2))
    supervisor, membership, _ = rigs[0]
    lines = supervisor.script()
    endpoint = add_endpoint(membership, supervisor.url)
    lines.put_nowait(state_line(7, "READY"))
    await until(lambda: membership.eligible("m") == [endpoint])
    endpoint.transfers_pending = 2
    lines.put_nowait(state_line(8, "DRAINING", "leaving_routing"))
    await asyncio.wait_for(supervisor.ack_seen.wait(), 2.0)
    (ack,) = supervisor.acks
    assert ack["transfers_unconfirmed"] == 2 and ack["undispatched"] == 0

    # the supervisor keeps the figure with the acknowledgement (what the drain report sums)
    routers = RouterSubscriptions(lambda kind, **fields: {}, lambda line: None)
    asked = AckRequest.model_validate(ack)
    kept = routers.acknowledge(
        asked.router_id, asked.epoch, transfers_unconfirmed=asked.transfers_unconfirmed
    )
    assert kept.to_json()["transfers_unconfirmed"] == 2
    assert AckRequest.model_validate({**ack, "transfers_unconfirmed": True}).transfers_unconfirmed == 0
