"""The lifecycle state machine, as rules checked against generated sequences: no transition outside
the table, readiness true in READY only, epochs strictly increasing (across supervisor restarts too)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from corral.supervisor.lifecycle.states import (
    ALLOWED_TRANSITIONS,
    EngineState,
    IllegalTransition,
    StateEvent,
    StateMachine,
    is_allowed,
)
from corral.supervisor.state.oplog import last_epoch

S = EngineState


def test_the_table_covers_every_state_and_names_the_architecture_path() -> None:
    assert set(ALLOWED_TRANSITIONS) == set(EngineState)
    path = [S.STARTING, S.READY, S.DRAINING, S.SLEEPING, S.WAKING, S.READY, S.DRAINING, S.STOPPING]
    for a, b in itertools.pairwise(path):
        assert is_allowed(a, b), (a, b)
    for state in EngineState:
        assert is_allowed(state, S.FAILED), f"FAILED must be reachable from {state}"
    assert is_allowed(S.FAILED, S.STARTING)  # restart in place
    assert not is_allowed(S.READY, S.STOPPING)  # never stop without draining first
    assert not is_allowed(S.STARTING, S.DRAINING)


def test_a_refused_transition_changes_nothing() -> None:
    machine = StateMachine()
    seen: list[StateEvent] = []
    machine.subscribe(seen.append)
    with pytest.raises(IllegalTransition, match="STARTING → SLEEPING"):
        machine.transition(S.SLEEPING, "not allowed")
    assert machine.state is S.STARTING and machine.epoch == 1 and len(seen) == 1


def test_since_moves_with_the_state_not_the_sub_state() -> None:
    clock = iter(range(100))
    machine = StateMachine(clock=lambda: float(next(clock)))
    machine.transition(S.STARTING, "engine", "loading_model")
    assert machine.since == 0.0
    machine.transition(S.READY, "smoke passed")
    assert machine.since == machine.current.time == 2.0
    body = machine.snapshot()
    assert body["state"] == "READY" and body["ready"] is True and body["epoch"] == 3


class LifecycleRules(RuleBasedStateMachine):
    """A supervisor's state machine driven by arbitrary requests, restarted now and then with its
    epoch continued from the operation log (here: the list of recorded events)."""

    @initialize()
    def boot(self) -> None:
        self.log: list[dict[str, Any]] = []
        self.events: list[StateEvent] = []
        self._start_machine()

    def _start_machine(self) -> None:
        self.machine = StateMachine(first_epoch=last_epoch(self.log) + 1)
        self.machine.subscribe(self._record)

    def _record(self, event: StateEvent) -> None:
        self.events.append(event)
        self.log.append({"record": "transition", **event.to_json()})

    @rule(to=st.sampled_from(EngineState), reason=st.text(max_size=5), sub=st.none() | st.text(max_size=5))
    def request(self, to: EngineState, reason: str, sub: str | None) -> None:
        before = self.machine.current
        if is_allowed(before.to_state, to):
            event = self.machine.transition(to, reason, sub)
            assert event.from_state is before.to_state and event.to_state is to
        else:
            with pytest.raises(IllegalTransition):
                self.machine.transition(to, reason, sub)
            assert self.machine.current is before

    @rule()
    def supervisor_restarts(self) -> None:
        self._start_machine()

    @invariant()
    def readiness_only_in_ready(self) -> None:
        assert self.machine.ready == (self.machine.state is S.READY)
        for event in self.events:
            assert event.ready == (event.to_state is S.READY)

    @invariant()
    def every_transition_is_in_the_table(self) -> None:
        for event in self.events:
            if event.from_state is not None:
                assert event.to_state in ALLOWED_TRANSITIONS[event.from_state]

    @invariant()
    def epochs_strictly_increase(self) -> None:
        epochs = [e.epoch for e in self.events]
        assert all(a < b for a, b in itertools.pairwise(epochs)), epochs


TestLifecycleRules = LifecycleRules.TestCase
