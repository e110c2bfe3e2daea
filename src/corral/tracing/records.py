"""A change record as a trace: a runbook operation's (PRECHECK … POSTCHECK on one engine) or a rollout's
(a step per group), written when the record is, so its trace id goes into the record. The operation is
the root span, from the record's start to its end; each step a child span over its own time, failed
where the step failed, with the step's evidence as `corral.evidence.*` attributes (scalars as they are,
anything else as bounded JSON; at most MAX_EVIDENCE_ATTRIBUTES a step)."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, set_span_in_context

from corral.contracts.records import ChangeRecord, StepRecord

R = TypeVar("R", bound=ChangeRecord)

MAX_EVIDENCE_ATTRIBUTES = 48
MAX_VALUE_CHARS = 1024


class RecordTraces:
    """Writes each change record it is given as one trace, through a process's tracer."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def traced(self, record: R) -> R:
        """The record with the trace id of the trace just written for it."""
        return record.model_copy(update={"trace_id": self.trace(record)})

    def trace(self, record: ChangeRecord) -> str:
        """Writes the trace; returns its id (32 hex digits)."""
        attributes: dict[str, Any] = {
            "corral.operation.kind": record.kind,
            "corral.operation.outcome": record.outcome,
        }
        for key, value in (
            ("corral.operation.id", record.id),
            ("corral.operation.reason", record.reason),
            ("corral.fleet.id", record.fleet_id),
            ("corral.fleet.run", record.fleet_run),
            ("corral.router", record.router),
            ("corral.bundle.to", _bundle_name(record.to_bundle)),
        ):
            if value:
                attributes[key] = _bounded(str(value))
        engines = sorted(record.from_bundles)
        if engines:
            attributes["corral.engines"] = engines[:64]
        root = self._tracer.start_span(
            f"{record.kind} {record.id}" if record.id else record.kind,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=_nanos(record.started),
        )
        context = set_span_in_context(root)
        for step in record.steps:
            self._step(step, context)
        if record.outcome not in ("succeeded", ""):
            root.set_status(Status(StatusCode.ERROR, _bounded(record.reason or record.outcome)))
        root.end(end_time=max(_nanos(record.finished), _nanos(record.started)))
        return f"{root.get_span_context().trace_id:032x}"

    def _step(self, step: StepRecord, context: Any) -> None:
        attributes: dict[str, Any] = {"corral.step": step.step, "corral.step.ok": step.ok}
        if step.group:
            attributes["corral.group"] = step.group
        if step.detail:
            attributes["corral.step.detail"] = _bounded(step.detail)
        attributes.update(evidence_attributes(step.data))
        span = self._tracer.start_span(
            f"{step.step} {step.group}" if step.group else step.step,
            context=context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=_nanos(step.started),
        )
        if not step.ok:
            span.set_status(Status(StatusCode.ERROR, _bounded(step.detail or "failed")))
        span.end(end_time=_nanos(step.started + max(step.seconds, 0.0)))


def evidence_attributes(evidence: dict[str, Any]) -> dict[str, Any]:
    """A step's evidence as span attributes: `corral.evidence.<key>`, a scalar as it is, a list of
    scalars as a list, anything else as its JSON, each at most MAX_VALUE_CHARS; the keys beyond
    MAX_EVIDENCE_ATTRIBUTES counted in `corral.evidence.more`."""
    out: dict[str, Any] = {}
    keys = list(evidence)
    for key in keys[:MAX_EVIDENCE_ATTRIBUTES]:
        value = evidence[key]
        name = f"corral.evidence.{str(key)[:64]}"
        if isinstance(value, bool | int | float):
            out[name] = value
        elif isinstance(value, str):
            out[name] = _bounded(value)
        elif value is None:
            continue
        else:
            out[name] = _bounded(json.dumps(value, default=str, sort_keys=True))
    if len(keys) > MAX_EVIDENCE_ATTRIBUTES:
        out["corral.evidence.more"] = len(keys) - MAX_EVIDENCE_ATTRIBUTES
    return out


def _bundle_name(bundle: dict[str, Any] | None) -> str | None:
    if not bundle:
        return None
    name = bundle.get("name")
    return str(name) if name else None


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def _nanos(seconds: float) -> int:
    return int(seconds * 1e9)
