"""Membership's eligible sets: built once per change and shared until the next, rebuilt on every kind of
change that can alter them (so a cached set is never stale), with an in-flight total that follows the
members' counts (the O(1) load bound) and that a replaced set stops following."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.membership.group_tag import group_tag
from corral.router.membership.membership import Membership
from corral.router.routing.filters import load_bound


def ready(url: str, *models: str, **kwargs: object) -> Endpoint:
    return Endpoint(url, frozenset(models or {"m"}), EngineState.READY, "test", **kwargs)  # type: ignore[arg-type]


def fresh_eligible(m: Membership, model: str, now: float) -> list[Endpoint]:
    """What the eligible set must hold, computed from scratch."""
    return [
        e
        for e in m.endpoints()
        if e.in_routing and model in e.models - e.withdrawn_models and e.ejected_until <= now
    ]


def _view(url: str) -> SupervisorView:
    return SupervisorView(url, link="connected", link_reason="open", state=EngineState.READY, epoch=1)


CHANGES: dict[str, Callable[[Membership], None]] = {
    "added": lambda m: m.add(ready("http://new"), "test") and None,
    "removed": lambda m: m.remove("http://b", "gone") and None,
    "not ready": lambda m: m.update("http://b", "probe failed", state=EngineState.STARTING) and None,
    "models changed": lambda m: m.update("http://b", "models", models=frozenset({"other"})) and None,
    "model withdrawn": lambda m: m.withdraw_models("http://b", frozenset({"m"})) and None,
    "ejected": lambda m: m.get("http://b").eject(100.0, 5.0) and None,  # type: ignore[union-attr]
    "supervisor not ready": lambda m: _supervisor_says(m, EngineState.DRAINING),
    "group member down": lambda m: m.update("http://g1", "probe failed", state=EngineState.STARTING) and None,
}


def _supervisor_says(m: Membership, state: EngineState) -> None:
    endpoint = m.get("http://s")
    assert endpoint is not None and endpoint.supervisor is not None
    endpoint.supervisor.state = state
    m.supervisor_changed("http://s", "supervisor_state")


def fleet() -> Membership:
    m = Membership()
    m.add(ready("http://a"), "test")
    m.add(ready("http://b"), "test")
    m.add(ready("http://s", supervisor=_view("http://sup")), "test")
    tag = group_tag("pair", 2)
    m.add(ready("http://g1", group=tag), "test")
    m.add(ready("http://g2", group=tag), "test")
    return m


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_every_kind_of_change_rebuilds_the_set_and_nothing_else_does(change: str) -> None:
    m = fleet()
    before = m.eligible("m", now=100.0)
    assert before == fresh_eligible(m, "m", 100.0) and len(before) == 5
    assert m.eligible("m", now=100.0) is before  # unchanged: the same set, no walk
    m.get("http://a").in_flight += 3  # type: ignore[union-attr]  # traffic is not a change
    assert m.eligible("m", now=100.0) is before
    CHANGES[change](m)
    after = m.eligible("m", now=100.0)
    assert after is not before
    assert after == fresh_eligible(m, "m", 100.0) != before


def test_a_set_leaving_out_an_ejected_endpoint_is_rebuilt_when_the_ejection_ends() -> None:
    m = fleet()
    b = m.get("http://b")
    assert b is not None
    b.eject(100.0, 5.0)
    during = m.eligible("m", now=101.0)
    assert b not in during and m.eligible("m", now=104.9) is during
    back = m.eligible("m", now=105.0)
    assert b in back and back == fresh_eligible(m, "m", 105.0)


def test_role_sets_follow_the_supervisors_role() -> None:
    m = fleet()
    s = m.get("http://s")
    assert s is not None and s.supervisor is not None
    assert s in m.eligible_role("m", "prefill", now=1.0)
    s.supervisor.role = "decode"
    m.supervisor_changed("http://s", "supervisor_ready")
    assert s not in m.eligible_role("m", "prefill", now=1.0)
    assert s in m.eligible_role("m", "decode", now=1.0)


def test_the_in_flight_total_follows_members_and_a_replaced_set_stops_following() -> None:
    m = fleet()
    a, b = m.get("http://a"), m.get("http://b")
    assert a is not None and b is not None
    a.in_flight = 2
    first = m.eligible("m", now=1.0)
    assert first.in_flight == 2
    b.in_flight += 5
    a.in_flight -= 1
    assert first.in_flight == 6 == sum(e.in_flight for e in first)
    assert load_bound(first, eps=1.0) == load_bound(list(first), eps=1.0)
    m.update("http://b", "probe failed", state=EngineState.STARTING)
    second = m.eligible("m", now=1.0)
    assert second.in_flight == 1  # b left the set: its requests no longer count
    b.in_flight -= 5
    a.in_flight += 4
    assert second.in_flight == 5 and first.in_flight == 6  # the old set is detached, frozen
    assert a.tallies == (second,)
