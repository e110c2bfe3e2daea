"""The engine lifecycle state machine: the states, the one table of allowed transitions, and a
`StateMachine` that emits an epoch-numbered `StateEvent` for every change and refuses anything else.

Readiness is true in READY alone. Sub-states refine STARTING (where startup is), DRAINING (which
drain step, or `not_answering`: out of routing because the engine stopped answering) and STOPPING;
a sub-state change is an event of its own (from == to) with a new epoch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from corral.engine_state import EngineState, is_ready

__all__ = [
    "ALLOWED_TRANSITIONS",
    "DrainPhase",
    "EngineState",
    "IllegalTransition",
    "StartingPhase",
    "StateEvent",
    "StateMachine",
    "StoppingPhase",
    "is_allowed",
    "is_ready",
]


class StartingPhase(StrEnum):
    """Where a STARTING engine is; the engine phases come from vLLM's own log lines."""

    WAITING_DEPENDENCIES = "waiting_dependencies"
    PRECHECK = "precheck"  # checks that authorize the start (corral.supervisor.precheck), no engine yet
    ENGINE_STARTING = "engine_starting"
    LOADING_MODEL = "loading_model"
    ALLOCATING_KV_CACHE = "allocating_kv_cache"
    CAPTURING_GRAPHS = "capturing_graphs"
    SERVER_STARTING = "server_starting"
    SMOKE_TESTING = "smoke_testing"
    RESTARTING = "restarting"


class DrainPhase(StrEnum):
    LEAVING_ROUTING = "leaving_routing"
    WAITING_IN_FLIGHT = "waiting_in_flight"
    WAITING_TRANSFERS = "waiting_transfers"  # a disaggregated engine's KV transfers (drain_transfers.py)
    ABORTING = "aborting"
    # not a drain step: a READY engine whose /health stopped answering, withdrawn from routing with its
    # engine kept (lifecycle/not_answering.py); back to READY through the smoke request, or FAILED by
    # the stall rule. DRAINING because that is the state every router already reads as "out of
    # routing, engine kept, may return READY" (READY → DRAINING → READY | FAILED | STOPPING).
    NOT_ANSWERING = "not_answering"


class StoppingPhase(StrEnum):
    STOPPING_ENGINE = "stopping_engine"
    ENGINE_STOPPED = "engine_stopped"


S = EngineState

# The lifecycle, stated once: STARTING → READY ⇄ DRAINING → {PAUSED, SLEEPING, STOPPING} → WAKING → READY,
# FAILED from anywhere, FAILED → STARTING for a restart in place, DRAINING → STARTING for a drained
# engine restarted on another bundle (the switch_bundle operation). Self-transitions carry sub-state
# progress (for READY, a change of what it serves: a LoRA adapter withdrawn from routing; for SLEEPING,
# a partial wake; for FAILED, the verdict that no restart is left).
ALLOWED_TRANSITIONS: Mapping[EngineState, frozenset[EngineState]] = {
    S.STARTING: frozenset({S.STARTING, S.READY, S.STOPPING, S.FAILED}),
    S.READY: frozenset({S.READY, S.DRAINING, S.FAILED}),
    S.DRAINING: frozenset({S.DRAINING, S.READY, S.PAUSED, S.SLEEPING, S.STOPPING, S.STARTING, S.FAILED}),
    S.PAUSED: frozenset({S.WAKING, S.STOPPING, S.FAILED}),
    S.SLEEPING: frozenset({S.SLEEPING, S.WAKING, S.STOPPING, S.FAILED}),
    S.WAKING: frozenset({S.READY, S.STOPPING, S.FAILED}),
    S.STOPPING: frozenset({S.STOPPING, S.FAILED}),
    S.FAILED: frozenset({S.FAILED, S.STARTING, S.STOPPING}),
}


def is_allowed(from_state: EngineState, to_state: EngineState) -> bool:
    return to_state in ALLOWED_TRANSITIONS[from_state]


class IllegalTransition(RuntimeError):
    """A transition the table does not allow; the machine's state is unchanged."""

    def __init__(self, from_state: EngineState, to_state: EngineState, reason: str) -> None:
        allowed = ", ".join(sorted(ALLOWED_TRANSITIONS[from_state])) or "nothing"
        super().__init__(
            f"transition {from_state} → {to_state} ({reason}) is not allowed; from {from_state}: {allowed}"
        )
        self.from_state = from_state
        self.to_state = to_state


@dataclass(frozen=True)
class StateEvent:
    """One change of state (or of sub-state), numbered by a strictly increasing epoch."""

    epoch: int
    from_state: EngineState | None
    to_state: EngineState
    sub_state: str | None
    reason: str
    time: float
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return is_ready(self.to_state)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "state",
            "epoch": self.epoch,
            "from": self.from_state.value if self.from_state else None,
            "to": self.to_state.value,
            "state": self.to_state.value,
            "sub_state": self.sub_state,
            "ready": self.ready,
            "reason": self.reason,
            "evidence": dict(self.evidence),
            "time": self.time,
        }


StateListener = Callable[[StateEvent], None]


class StateMachine:
    """Holds the current state; `transition` checks the table, numbers the event and tells listeners.

    `first_epoch` is one past the last epoch this engine's supervisor ever emitted (read back from the
    operation log), so epochs keep increasing across supervisor restarts.
    """

    def __init__(
        self,
        first_epoch: int = 1,
        initial: EngineState = EngineState.STARTING,
        sub_state: str | None = StartingPhase.WAITING_DEPENDENCIES,
        reason: str = "supervisor started",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._listeners: list[StateListener] = []
        self._current = StateEvent(first_epoch, None, initial, sub_state, reason, clock())
        self._since = self._current.time
        self.transitions = 0

    @property
    def current(self) -> StateEvent:
        return self._current

    @property
    def state(self) -> EngineState:
        return self._current.to_state

    @property
    def sub_state(self) -> str | None:
        return self._current.sub_state

    @property
    def epoch(self) -> int:
        return self._current.epoch

    @property
    def ready(self) -> bool:
        return is_ready(self.state)

    @property
    def since(self) -> float:
        """When the current state (not sub-state) was entered."""
        return self._since

    def subscribe(self, listener: StateListener) -> None:
        """`listener` gets every event from now on; it also gets the current one at once."""
        self._listeners.append(listener)
        listener(self._current)

    def unsubscribe(self, listener: StateListener) -> None:
        self._listeners.remove(listener)

    def transition(
        self,
        to_state: EngineState,
        reason: str,
        sub_state: str | None = None,
        evidence: Mapping[str, Any] | None = None,
    ) -> StateEvent:
        from_state = self.state
        if not is_allowed(from_state, to_state):
            raise IllegalTransition(from_state, to_state, reason)
        event = StateEvent(
            epoch=self.epoch + 1,
            from_state=from_state,
            to_state=to_state,
            sub_state=sub_state,
            reason=reason,
            time=self._clock(),
            evidence=dict(evidence or {}),
        )
        self._current = event
        self.transitions += 1
        if to_state is not from_state:
            self._since = event.time
        for listener in list(self._listeners):
            listener(event)
        return event

    def snapshot(self) -> dict[str, Any]:
        """The probes' and `/v1/state`'s body: the current event plus since-when."""
        return {**self._current.to_json(), "since": self._since}
