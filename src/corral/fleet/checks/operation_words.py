"""The runbook operation in flight on an engine, as `corral status` and `corral doctor` say it:
`sleep (level 1) at DRAIN for 12 s`, read leniently from the supervisor's `/v1/state` `operation`
(absent from supervisors before issue 18, which read as none)."""

from __future__ import annotations

import time
from typing import Any

from corral.contracts.supervisor import OperationInFlight, read_operation

# the runbook document's names for the steps whose value is not simply the name in capitals
_STEP_NAMES = {"drain_policy": "DRAIN"}


def step_name(step: str) -> str:
    """`drain_policy` -> `DRAIN`, `remove_from_routing` -> `REMOVE FROM ROUTING`."""
    return _STEP_NAMES.get(step) or step.replace("_", " ").upper()


def operation_in_flight(state: dict[str, Any] | None) -> OperationInFlight | None:
    """The supervisor's `operation` when this version can read it (the state contract's reader); None
    when there is none, the supervisor predates it, or the value is not one this version reads."""
    return read_operation((state or {}).get("operation"))


def age(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def operation_words(op: OperationInFlight, now: float | None = None, *, since_word: str = "for") -> str:
    """`sleep (level 1) at DRAIN for 12 s` (`since_word="since"`: `… at DRAIN since 12 s`); the age is
    the supervisor's clock against this machine's, left out when the supervisor gave no time."""
    text = f"{op.kind}{' (' + op.detail + ')' if op.detail else ''} at {step_name(op.step)}"
    if op.since is not None:
        text += f" {since_word} {age(max(0.0, (now or time.time()) - op.since))}"
    return text
