"""When the router judges an endpoint failed (`Endpoint.failure_verdict`), membership tells its failure
listeners once, as the judgment begins: a probe failure after the engine had answered, or a supervisor
that says FAILED or DRAINING/not_answering. A drain, a sleep or a lost stream is no failure: requests
out there finish where they are."""

from __future__ import annotations

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.membership.membership import Membership


def judged(m: Membership) -> list[tuple[str, str]]:
    heard: list[tuple[str, str]] = []
    m.failure_listeners.append(lambda e, why: heard.append((e.url, why)))
    return heard


def say(
    m: Membership, e: Endpoint, state: EngineState, sub: str | None, epoch: int, link: str = "connected"
) -> None:
    view = e.supervisor
    assert view is not None
    view.link, view.state, view.sub_state, view.epoch, view.reason = link, state, sub, epoch, "said"
    m.supervisor_changed(e.url, cause="test")


def test_a_failed_probe_is_told_once_and_forgotten_when_the_engine_answers() -> None:
    m = Membership()
    heard = judged(m)
    m.add(Endpoint("http://a", frozenset({"m"}), EngineState.READY, "answered"), "test")
    m.update("http://a", "/v1/models probe failed: timed out", state=EngineState.FAILED)
    m.update("http://a", "/v1/models probe failed: timed out again", state=EngineState.FAILED)
    assert heard == [("http://a", "/v1/models probe failed: timed out")]
    m.update("http://a", "GET /v1/models answered", state=EngineState.READY)
    m.update("http://a", "/v1/models probe failed: refused", state=EngineState.FAILED)
    assert len(heard) == 2


def test_the_supervisor_failing_or_withdrawing_an_unanswering_engine_is_a_failure() -> None:
    m = Membership()
    heard = judged(m)
    e = m.add(
        Endpoint(
            "http://a", frozenset({"m"}), EngineState.READY, "answered", supervisor=SupervisorView("http://s")
        ),
        "t",
    )
    say(m, e, EngineState.READY, None, 1)
    say(m, e, EngineState.DRAINING, "not_answering", 2)
    assert len(heard) == 1 and "DRAINING/not_answering at epoch 2" in heard[0][1]
    say(m, e, EngineState.FAILED, None, 3)  # the stall rule after the withdrawal: the same judgment
    assert len(heard) == 1
    say(m, e, EngineState.STARTING, "restarting", 4)
    say(m, e, EngineState.READY, None, 5)
    say(m, e, EngineState.FAILED, None, 6)
    assert len(heard) == 2 and "FAILED at epoch 6" in heard[1][1]


def test_drains_sleeps_and_lost_streams_are_not_failures() -> None:
    m = Membership()
    heard = judged(m)
    e = m.add(
        Endpoint(
            "http://a", frozenset({"m"}), EngineState.READY, "answered", supervisor=SupervisorView("http://s")
        ),
        "t",
    )
    for epoch, (state, sub) in enumerate(
        [
            (EngineState.READY, None),
            (EngineState.DRAINING, "leaving_routing"),
            (EngineState.DRAINING, "waiting_in_flight"),
            (EngineState.SLEEPING, "level_1"),
            (EngineState.WAKING, None),
            (EngineState.READY, None),
        ]
    ):
        say(m, e, state, sub, epoch + 1)
    say(m, e, EngineState.FAILED, None, 9, link="lost")  # a stream that is not live says nothing
    assert heard == []
