"""`corral doctor`'s branches that tell an engine that answers nothing from one that answers but is
stalled (issue 30), read from its supervisor's state:

- `not-ready/not-answering`: DRAINING/not_answering — `/health` has not answered for
  `--unanswered-seconds`; out of routing, the engine kept; it returns READY once it answers and passes
  the smoke request, and the stall rule fails and restarts it after `--stall-seconds` of silence. A
  frozen process, a GPU hang, a wedged driver call or collective look like this from outside.
- `requests-failing/not-answering`: FAILED by the stall rule because the engine's `/metrics` stopped
  answering (the same silence, past `--stall-seconds`).
- answering but stalled is the tree's `requests-failing/hang` (its `/health` answered 200 while no token
  came); `stalled_words` puts those words in front of its evidence.
"""

from __future__ import annotations

from corral.engine_state import EngineState
from corral.fleet.checks.probe import EngineView

NOT_ANSWERING = "not-ready/not-answering"
FAILED_NOT_ANSWERING = "requests-failing/not-answering"
_SUB_STATE = "not_answering"  # the supervisor's DrainPhase.NOT_ANSWERING
_SILENT_METRICS = "stopped answering /metrics"
_STACK = (
    "capture a stack first (py-spy dump --pid ENGINE_PID) and look at the GPU (nvidia-smi, dmesg for Xid)"
)


def not_answering_branch(e: EngineView) -> tuple[str, str, str] | None:
    """(branch, evidence, next step) for an engine withdrawn because it answers nothing, or None."""
    state = e.state or {}
    reason = str(state.get("reason") or "")
    if e.lifecycle == EngineState.DRAINING and state.get("sub_state") == _SUB_STATE:
        evidence = state.get("evidence") or {}
        seen = (
            f"not answering: {evidence.get('probes_unanswered', '?')} /health probes unanswered "
            f"({evidence.get('probes_timed_out', '?')} timed out), last answer: "
            f"{evidence.get('last_answer', '?')}, since {state.get('since')}"
        )
        return (
            NOT_ANSWERING,
            f"{seen}; {reason}",
            "it is out of routing with the engine kept: it returns READY by itself once it answers and "
            "passes the smoke request, and is failed and restarted after --stall-seconds if it stays "
            f"silent; meanwhile {_STACK}",
        )
    return None


def silent_failure_branch(e: EngineView) -> tuple[str, str, str] | None:
    """(branch, evidence, next step) for an engine the stall rule failed for silence, or None."""
    reason = str((e.state or {}).get("reason") or "")
    if e.lifecycle == EngineState.FAILED and _SILENT_METRICS in reason:
        return (
            FAILED_NOT_ANSWERING,
            f"not answering, past --stall-seconds: {reason}",
            f"the supervisor restarts it in place; if it recurs, {_STACK}",
        )
    return None


def stalled_words(reason: str) -> str:
    """The hang branch's evidence for the stall rule's verdict: the engine answered, but was stalled."""
    return f"answering but stalled (/health 200, no token): {reason}"
