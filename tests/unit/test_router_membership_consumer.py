"""The membership consumer: sources' events become endpoints keyed by identity. A duplicate add is
idempotent, a new identity at a known address is a new endpoint (the old one leaves, cause
`replaced`), and updates or removals of an unknown identity change nothing."""

from __future__ import annotations

import time

from corral.engine_state import EngineState
from corral.router.membership.consumer import MembershipConsumer
from corral.router.membership.events import EndpointAdded, EndpointRemoved, EndpointUpdated
from corral.router.membership.membership import Membership

URL = "http://10.0.0.5:8000"


def added(identity: str, url: str = URL) -> EndpointAdded:
    return EndpointAdded(identity, url, source="test", reason="seen", origin=f"thing {identity}")


def ready(consumer: MembershipConsumer, identity: str) -> None:
    consumer.emit(EndpointUpdated(identity, "answered", state=EngineState.READY, models=frozenset({"m"})))


def test_a_duplicate_add_is_idempotent() -> None:
    consumer = MembershipConsumer(Membership())
    consumer.emit(added("uid-a"))
    endpoint = consumer.membership.get(URL)
    ready(consumer, "uid-a")
    assert endpoint is not None
    endpoint.eject(time.monotonic(), 30.0)

    consumer.emit(added("uid-a"))

    assert consumer.membership.endpoints() == [endpoint]
    assert endpoint.state is EngineState.READY and endpoint.is_ejected(time.monotonic())
    assert list(consumer.membership.exits) == []


def test_a_new_identity_at_a_known_address_is_a_new_endpoint() -> None:
    consumer = MembershipConsumer(Membership())
    consumer.emit(added("uid-a"))
    old = consumer.membership.get(URL)
    ready(consumer, "uid-a")
    assert old is not None
    old.eject(time.monotonic(), 30.0)

    consumer.emit(added("uid-b"))

    new = consumer.membership.get(URL)
    assert new is not None and new is not old
    assert new.state is EngineState.STARTING and not new.is_ejected(time.monotonic())
    assert [(r.kind, r.cause) for r in consumer.membership.exits] == [("removed", "replaced")]
    # the old identity is gone: its late events do not touch the new endpoint
    ready(consumer, "uid-a")
    consumer.emit(EndpointRemoved("uid-a", "late delete"))
    assert consumer.membership.get(URL) is new and new.state is EngineState.STARTING


def test_updates_and_removals_follow_the_identity() -> None:
    consumer = MembershipConsumer(Membership())
    consumer.emit(added("one", "http://10.0.0.1:8000"))
    consumer.emit(added("two", "http://10.0.0.2:8000"))
    ready(consumer, "two")
    consumer.emit(EndpointUpdated("unknown", "nothing", state=EngineState.READY))
    consumer.emit(EndpointRemoved("one", "gone", cause="deleted", event_version="9"))

    assert [e.url for e in consumer.membership.endpoints()] == ["http://10.0.0.2:8000"]
    assert consumer.membership.eligible("m")[0].url == "http://10.0.0.2:8000"
    exit_ = consumer.membership.exits[0]
    assert (exit_.url, exit_.cause, exit_.event_version) == ("http://10.0.0.1:8000", "deleted", "9")
    assert consumer.url_of("one") is None and consumer.url_of("two") == "http://10.0.0.2:8000"
