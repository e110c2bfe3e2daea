"""The lifecycle vocabulary every Corral component shares: the engine states the supervisor's state
machine moves through and the router routes by. Readiness is true in READY alone."""

from __future__ import annotations

from enum import StrEnum


class EngineState(StrEnum):
    STARTING = "STARTING"
    READY = "READY"
    DRAINING = "DRAINING"
    PAUSED = "PAUSED"
    SLEEPING = "SLEEPING"
    STOPPING = "STOPPING"
    WAKING = "WAKING"
    FAILED = "FAILED"


def is_ready(state: EngineState) -> bool:
    """Readiness (may this engine get new traffic now?) is true in READY and nowhere else."""
    return state is EngineState.READY
