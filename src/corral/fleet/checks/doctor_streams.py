"""`corral doctor`'s aborted-streams branch: the router's `corral_router_stream_failures_total`
(streams ended by the engine's error event, finished with reason abort, or cut mid-stream) with each
engine's own count of aborted and failed requests (`vllm:request_success_total{finished_reason}`), and
the command that finds the cause for the most frequent kind.
"""

from __future__ import annotations

from corral.engine.metric_names import FINISHED
from corral.engine.metrics_text import samples
from corral.fleet.checks.probe import FleetView

ABORTED_STREAMS = "requests-failing/aborted-streams"
STREAM_FAILURES = "corral_router_stream_failures_total"
ENGINE_FINISHED = FINISHED

_NEXT = {
    "engine_abort": (
        "the engine aborted them: find the operation that did (sleep, drain or pause with mode abort) in "
        'each supervisor\'s log: grep \'"mode": "abort"\' STATE_DIR/oplog.jsonl; use mode wait (or keep) '
        "for planned operations"
    ),
    "engine_error": (
        "the engine ended them with an error event: read the engine's log: corral logs --engine NAME "
        "(a local fleet), else corral status --supervisor URL --json"
    ),
    "cut": (
        "the engine's connection broke mid-stream (engine died or restarted): its restarts in "
        "corral status --json; then the process branches of this report"
    ),
}


def stream_failures(text: str) -> dict[tuple[str, str], float]:
    """(model, how) → streams, from the router's /metrics text."""
    found: dict[tuple[str, str], float] = {}
    try:
        failures = list(samples(text, (STREAM_FAILURES,), strict=True))
    except ValueError:
        return found
    for sample in failures:
        if sample.value > 0:
            key = (sample.labels.get("model", ""), sample.labels.get("how", ""))
            found[key] = found.get(key, 0.0) + sample.value
    return found


def engine_ended(text: str | None) -> dict[str, float]:
    """finished_reason (abort, error) → requests, from one engine's /metrics text."""
    found: dict[str, float] = {}
    if not text:
        return found
    try:
        finished = list(samples(text, (ENGINE_FINISHED,), strict=True))
    except ValueError:
        return found
    for sample in finished:
        reason = sample.labels.get("finished_reason", "")
        if reason in ("abort", "error") and sample.value > 0:
            found[reason] = found.get(reason, 0.0) + sample.value
    return found


def aborted_streams(view: FleetView) -> tuple[str, str, str] | None:
    """(branch, evidence, next command) when the router saw streams end abnormally."""
    failures = stream_failures(view.router_metrics or "")
    if not failures:
        return None
    by_how: dict[str, float] = {}
    for (_, how), n in failures.items():
        by_how[how] = by_how.get(how, 0.0) + n
    shown = ", ".join(f"{how}×{n:g} (model {model})" for (model, how), n in sorted(failures.items()))
    engines = [
        f"{e.name}: " + ", ".join(f"{reason}×{n:g}" for reason, n in sorted(ended.items()))
        for e in view.engines
        if (ended := engine_ended(e.metrics))
    ]
    evidence = f"router {STREAM_FAILURES} since it started: {shown}"
    if engines:
        evidence += f"; engines' {ENGINE_FINISHED}{{finished_reason}}: " + "; ".join(engines)
    top = max(sorted(by_how), key=lambda how: by_how[how])
    return ABORTED_STREAMS, evidence, _NEXT.get(top, _NEXT["cut"])
