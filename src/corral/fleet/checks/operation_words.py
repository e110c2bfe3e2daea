"""The runbook operation in flight on an engine, as `corral status` and `corral doctor` say it:
`sleep (level 1) at DRAIN for 12 s`, read leniently from the supervisor's `/v1/state` `operation`
(absent from supervisors before issue 18, which read as none)."""

from __future__ import annotations

import time
from typing import Any

# the runbook document's names for the steps whose value is not simply the name in capitals
_STEP_NAMES = {"drain_policy": "DRAIN"}


def step_name(step: str) -> str:
    """`drain_policy` -> `DRAIN`, `remove_from_routing` -> `REMOVE FROM ROUTING`."""
    return _STEP_NAMES.get(step) or step.replace("_", " ").upper()


def operation_in_flight(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """The supervisor's `operation` ({kind, id, detail, step, since}) when it names a kind and a step;
    None when there is none, the supervisor predates it, or the value is not one this version reads."""
    op = (state or {}).get("operation")
    if not isinstance(op, dict) or not isinstance(op.get("kind"), str) or not isinstance(op.get("step"), str):
        return None
    since = op.get("since")
    return {
        "kind": op["kind"],
        "id": op.get("id") if isinstance(op.get("id"), str) else None,
        "detail": op.get("detail") if isinstance(op.get("detail"), str) else None,
        "step": op["step"],
        "since": float(since) if isinstance(since, int | float) and not isinstance(since, bool) else None,
    }


def age(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def operation_words(op: dict[str, Any], now: float | None = None, *, since_word: str = "for") -> str:
    """`sleep (level 1) at DRAIN for 12 s` (`since_word="since"`: `… at DRAIN since 12 s`); the age is
    the supervisor's clock against this machine's, left out when the supervisor gave no time."""
    text = f"{op['kind']}{' (' + op['detail'] + ')' if op.get('detail') else ''} at {step_name(op['step'])}"
    if isinstance(op.get("since"), float):
        text += f" {since_word} {age(max(0.0, (now or time.time()) - op['since']))}"
    return text
