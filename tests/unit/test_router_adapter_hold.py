"""A joining endpoint held out of routing (`Membership.admit`, `hold`, `release`): never eligible while
held, whatever it serves; named in its routing verdict; eligible again once released; a hold that
outlives its endpoint, or a release of an endpoint not held, changes nothing. And the carry's
operation id: one per adapter and engine life, safe in a URL path whatever the adapter's name."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.engine_state import EngineState
from corral.router.discovery.adapter_carry import AdapterCarry, CarrySettings, operation_id
from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.membership.membership import Membership


def supervised(url: str) -> Endpoint:
    return Endpoint(url, frozenset({"m", "lora-a"}), EngineState.READY, "test", supervisor=None)


def test_a_held_endpoint_is_never_eligible_until_released() -> None:
    m = Membership()
    m.admit = lambda e: "joining: adapters not carried" if e.url.endswith("b") else None
    a = m.add(supervised("http://a"), "test")
    b = m.add(supervised("http://b"), "test")
    assert a.held is None and b.held == "joining: adapters not carried"
    for model in ("m", "lora-a"):
        assert list(m.eligible(model)) == [a]
    assert not b.routable(0.0) and "joining: adapters not carried" in b.routing_verdict(0.0)
    assert m.ready_count() == 1

    assert m.release("http://b", "joined") is b
    assert b.held is None and b.routable(0.0)
    assert sorted(e.url for e in m.eligible("lora-a")) == ["http://a", "http://b"]

    m.hold("http://a", "held again")  # a routable endpoint held: out at once, its exit recorded
    assert list(m.eligible("m")) == [b]
    assert m.exits[-1].url == "http://a" and m.exits[-1].cause == "held"


def test_hold_and_release_of_unknown_or_unheld_endpoints_change_nothing() -> None:
    m = Membership()
    a = m.add(supervised("http://a"), "test")
    assert m.release("http://a", "nothing held") is a and a.held is None
    assert m.hold("http://gone", "x") is None and m.release("http://gone", "x") is None
    assert list(m.eligible("m")) == [a]


def test_the_supervisor_view_does_not_decide_the_hold() -> None:
    m = Membership()
    m.admit = lambda e: "joining" if e.supervisor is not None else None
    e = Endpoint(
        "http://s", frozenset({"m"}), EngineState.READY, "t", supervisor=SupervisorView("http://s:9")
    )
    e.supervisor.state = EngineState.READY  # type: ignore[union-attr]
    e.supervisor.link = "connected"  # type: ignore[union-attr]
    m.add(e, "test")
    assert e.held == "joining" and list(m.eligible("m")) == []


@settings(deadline=None, max_examples=200)
@given(st.text(min_size=1, max_size=300), st.one_of(st.none(), st.integers(min_value=0, max_value=2**31)))
def test_the_operation_id_is_path_safe_and_stable(adapter: str, pid: int | None) -> None:
    first = operation_id(adapter, pid)
    assert first == operation_id(adapter, pid)
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,120}", first), first


class _FakeSupervisor:
    """What the carry reads of a peer's supervisor: its desired adapters, counted."""

    def __init__(self) -> None:
        self.desired: dict[str, str] = {}
        self.reads = 0

    async def state(self) -> SimpleNamespace:
        self.reads += 1
        return SimpleNamespace(adapters=SimpleNamespace(desired=dict(self.desired)))


def _peer(m: Membership, url: str) -> Endpoint:
    view = SupervisorView(url + ":9")
    view.state, view.link = EngineState.READY, "connected"
    endpoint = m.add(Endpoint(url, frozenset({"m"}), EngineState.READY, "t", supervisor=view), "test")
    m.release(url, "joined")
    return endpoint


async def test_the_fleets_adapters_are_read_again_for_an_endpoint_ready_after_the_last_read() -> None:
    """The union of the peers' desired sets is kept a moment for endpoints joining together, but not
    across a peer released since, nor for an endpoint that became READY after the read: an adapter
    loaded on a peer in between would not be carried (the race `test_k8s_adapter_carry` lost under CI
    load: pod A released with nothing, an adapter loaded on A, pod B READY 1.8 s later and told the
    fleet had nothing)."""
    m = Membership()
    fake = _FakeSupervisor()

    class Carry(AdapterCarry):
        def _client(self, endpoint: Endpoint) -> Any:
            return fake

    carry = Carry(m, lambda e: None, CarrySettings(retry_seconds=60.0))
    _peer(m, "http://a")
    assert await carry._fleet_wanted(not_before=0.0) == {}
    fake.desired = {"adapter-rt": "/adapters/rt"}  # loaded on A at run time
    joined_ready = time.monotonic()
    assert await carry._fleet_wanted(not_before=joined_ready) == {"adapter-rt": "/adapters/rt"}
    reads = fake.reads
    assert await carry._fleet_wanted(not_before=joined_ready) == {"adapter-rt": "/adapters/rt"}
    assert fake.reads == reads  # another endpoint joining with it: the same read serves
    _peer(m, "http://c")  # a peer released since: read again, over both
    await carry._fleet_wanted(not_before=joined_ready)
    assert fake.reads == reads + 2
