"""Endpoint ejection and backoff, membership's eligibility index, and the /v1/models parsing."""

from __future__ import annotations

import time

import pytest

from corral.engine.models_probe import ModelsProbeError, parse_model_cards
from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.membership.membership import Membership


def ready(url: str, *models: str) -> Endpoint:
    return Endpoint(url, frozenset(models), EngineState.READY, "test")


def test_only_ready_and_unejected_endpoints_serving_the_model_are_eligible() -> None:
    m = Membership()
    a = m.add(ready("http://a", "m1"), "test")
    b = m.add(ready("http://b", "m1", "m2"), "test")
    c = m.add(Endpoint("http://c", frozenset({"m1"})), "test")  # STARTING
    assert m.eligible("m1", now=0.0) == [a, b]
    assert m.eligible("m2", now=0.0) == [b]
    assert m.eligible("nope", now=0.0) == []
    for state in EngineState:
        if state is not EngineState.READY:
            m.update("http://a", "test", state=state)
            assert a not in m.eligible("m1", now=0.0)
    m.update("http://a", "back", state=EngineState.READY)
    b.eject(now=10.0, base_seconds=5.0)
    assert m.eligible("m1", now=11.0) == [a]
    assert m.eligible("m1", now=15.1) == [a, b]
    assert c.state is EngineState.STARTING


def test_models_update_reindexes_and_remove_forgets() -> None:
    m = Membership()
    m.add(ready("http://a", "m1"), "test")
    assert m.knows("m1") and not m.knows("m2")
    m.update("http://a", "models changed", models=frozenset({"m2"}))
    assert m.knows("m2") and not m.knows("m1")
    removed = m.remove("http://a", "gone")
    assert removed is not None and removed.url == "http://a"
    assert not m.knows("m2")
    assert m.eligible("m2") == []
    assert m.update("http://a", "ignored", state=EngineState.READY) is None


def test_state_change_moves_since_and_reason() -> None:
    e = Endpoint("http://a/")
    assert e.url == "http://a"
    before = e.since
    assert e.set_state(EngineState.STARTING, "other reason")
    assert e.since == before
    assert e.set_state(EngineState.READY, "answered")
    assert e.reason == "answered" and e.since >= before
    assert not e.set_state(EngineState.READY, "answered")


def test_ejection_backs_off_exponentially_and_resets_on_success() -> None:
    e = ready("http://a", "m")
    assert e.eject(now=0.0, base_seconds=1.0) == 1.0
    # Failures of requests that were in flight together count once.
    assert e.eject(now=0.5, base_seconds=1.0) is None
    assert e.eject(now=1.0, base_seconds=1.0) == 2.0
    assert e.eject(now=3.0, base_seconds=1.0) == 4.0
    assert not e.routable(6.9) and e.routable(7.0)
    e.record_success()
    assert e.eject(now=10.0, base_seconds=1.0) == 1.0
    for i in range(20):
        e.eject(now=1000.0 * (i + 1), base_seconds=1.0)
    assert e.ejected_until - 20000.0 == 32.0  # capped


def test_model_cards_union_of_ready_endpoints() -> None:
    m = Membership()
    m.add(ready("http://a", "m1"), "t").model_cards = ({"id": "m1", "object": "model"},)
    m.add(ready("http://b", "m1", "m2"), "t").model_cards = (
        {"id": "m1", "object": "model"},
        {"id": "m2", "object": "model"},
    )
    m.add(Endpoint("http://c", frozenset({"m3"})), "t").model_cards = ({"id": "m3"},)
    assert [c["id"] for c in m.model_cards()] == ["m1", "m2"]


def test_retry_after_is_the_soonest_ejection_end() -> None:
    m = Membership()
    a = m.add(ready("http://a", "m"), "t")
    assert m.retry_after("m", default=5.0) == 5
    a.eject(now=time.monotonic(), base_seconds=2.5)
    assert m.retry_after("m", default=5.0) in (2, 3)


def test_parse_model_cards() -> None:
    body = b'{"object":"list","data":[{"id":"tiny","object":"model","max_model_len":256},{"x":1}]}'
    assert parse_model_cards(body) == ({"id": "tiny", "object": "model", "max_model_len": 256},)
    for bad in (b"not json", b"[]", b'{"data": 3}', b'{"data": []}'):
        with pytest.raises(ModelsProbeError):
            parse_model_cards(bad)


def test_an_endpoints_adapters_are_its_cards_with_a_parent() -> None:
    endpoint = ready("http://a", "base", "lora-b", "lora-a")
    assert endpoint.adapters == []  # no cards read yet
    endpoint.model_cards = (
        {"id": "base", "root": "/models/base", "parent": None},
        {"id": "lora-b", "root": "/adapters/b", "parent": "base"},
        {"id": "lora-a", "root": "/adapters/a", "parent": "base"},
    )
    assert endpoint.adapters == ["lora-a", "lora-b"]
