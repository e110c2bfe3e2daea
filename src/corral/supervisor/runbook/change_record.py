"""A runbook operation's change record (`contracts.records.ChangeRecord`, the one schema): the steps as
they ran, assembled with what `ChangeWitness` read of the engine when the operation began and when it
ended — bundle, memory, the admission gate's counters and forced exits, sleep level, adapters, and the
worker ranks (seen, alive, lost: the seed's "rank state" of every change).

`assemble` is pure (the readings in, the record out). The record travels in the operation's result as
`change_record`, in the oplog as a `change_record` record, and `corral sleep|wake|…` writes it to a
file. A section nothing could read stays None (or empty) and is named in `not_measured` with why."""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from corral import __version__
from corral.contracts.operations import ForcedExit
from corral.contracts.records import (
    ChangeRecord,
    LatencyRecord,
    MemoryDelta,
    RankChange,
    RankState,
    RollbackPoint,
    StepRecord,
)
from corral.contracts.traffic import RequestCounts, WindowSummary, WindowVerdict
from corral.engine.dev_api import AdminCallFailed
from corral.supervisor.lifecycle.device_memory import NVML
from corral.supervisor.lifecycle.drain_record import NO_GATE_FAILURES, bundle_of, request_failures
from corral.supervisor.lifecycle.forced_exits import FORCED_EXITS_LISTED
from corral.supervisor.lifecycle.memory_checks import ENGINE_METRICS, NO_SOURCE, reported
from corral.supervisor.runbook.common import admin_for, device_reading

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess

SUCCEEDED, FAILED, REFUSED = "succeeded", "failed", "refused"
NO_GATE_EXITS = (
    "forced_exits: no admission gate (--gate-port): requests the operation cut or aborted are not "
    "observable by request id"
)
M = TypeVar("M", bound=BaseModel)
STARTS_ENGINE = ("wake", "reload", "switch_bundle", "rollback")  # a warmup TTFT is expected of these


@dataclass(frozen=True)
class MemoryReading:
    """The engine's memory at one moment: GPU bytes (weights and KV cache, or NVML's total over its
    processes) and, where the engine reports it, the host memory holding a sleep's weight backup."""

    source: str  # engine_metrics | nvml
    gpu_bytes: int
    host_bytes: int | None = None


@dataclass(frozen=True)
class EngineReading:
    """What the supervisor knew of its engine at one moment of an operation."""

    at: float
    bundle: dict[str, Any] | None  # {"name", "fingerprint"}
    gate: RequestCounts | None  # None: no admission gate
    forced_mark: int | None  # the gate's forced-exit mark (None: no gate)
    sleep_level: int | None  # None: awake
    adapters: dict[str, str] = field(default_factory=dict)  # desired: name -> path
    memory: MemoryReading | None = None
    memory_unread: str = "not read"  # why `memory` is None
    ranks: RankState | None = None  # None: no engine process (the supervisor has not started one)


def read_engine(sup: EngineAccess) -> EngineReading:
    """The readings that cost nothing (no call to the engine); `read_memory` adds the memory."""
    gate = sup.gate
    status = sup.sleep_status
    engine = sup.engine
    return EngineReading(
        at=time.time(),
        bundle=bundle_of(sup.running_bundle, sup.bundle),
        gate=gate.counts() if gate is not None else None,
        forced_mark=gate.requests.mark() if gate is not None else None,
        sleep_level=status.level if status is not None else None,
        adapters=dict(sup.adapters.desired),
        ranks=RankState.model_validate(engine.ranks.summary()) if engine is not None else None,
    )


async def read_memory(sup: EngineAccess, reading: EngineReading) -> EngineReading:
    """`reading` with the engine's memory: its own figures (`corral sim`), else NVML over its
    processes, else why neither could be read."""
    engine = sup.engine
    if engine is None or not engine.running:
        return dataclasses.replace(reading, memory_unread="no engine process was running")
    try:
        figures = await admin_for(sup).figures()
    except AdminCallFailed as exc:
        return dataclasses.replace(reading, memory_unread=f"the engine's figures could not be read: {exc}")
    if reported(figures):
        gpu = (figures.gpu_weights_bytes or 0.0) + (figures.gpu_kv_cache_bytes or 0.0)
        host = int(figures.cpu_backup_bytes) if figures.cpu_backup_bytes is not None else None
        return dataclasses.replace(reading, memory=MemoryReading(ENGINE_METRICS, int(gpu), host))
    device = await device_reading(sup, figures)
    if device is None:
        return dataclasses.replace(reading, memory_unread=NO_SOURCE)
    if device.total_bytes <= 0:
        why = f"NVML attributes no GPU memory to the engine's processes {list(device.pids)} (a CPU engine?)"
        return dataclasses.replace(reading, memory_unread=why)
    return dataclasses.replace(reading, memory=MemoryReading(NVML, device.total_bytes))


def step_records(steps: Sequence[dict[str, Any]], fallback_start: float) -> list[StepRecord]:
    """The runbook's step entries (`template.Runbook.steps`) as the schema's timed steps."""
    records = []
    for entry in steps:
        raw = entry.get("evidence")
        evidence: dict[str, Any] = raw if isinstance(raw, dict) else {}
        detail = evidence.get("error") or evidence.get("skipped") or evidence.get("outcome") or ""
        records.append(
            StepRecord(
                step=str(entry.get("step")),
                started=float(entry.get("started") or fallback_start),
                seconds=float(entry.get("seconds") or 0.0),
                ok=entry.get("status") == "done",
                detail=str(detail),
                data=evidence,
            )
        )
    return records


def _evidence(steps: Sequence[StepRecord], name: str) -> dict[str, Any] | None:
    found = [s.data for s in steps if s.step == name]
    return found[-1] if found else None


def preload_of(steps: Sequence[StepRecord]) -> dict[str, Any] | None:
    """A bundle switch's daemon (lifecycle/preload_swap.py): EXECUTE's move, ended where RECOVER's took
    it back (the old pair); None when no daemon ran."""
    moved = (_evidence(steps, "execute") or {}).get("preload")
    if not isinstance(moved, dict):
        return None
    back = (_evidence(steps, "recover") or {}).get("preload")
    if isinstance(back, dict):
        return {**moved, "after": back.get("after"), "recovered": back}
    return moved


def latency_of(kind: str, engine: str, steps: Sequence[StepRecord]) -> tuple[LatencyRecord, list[str]]:
    """Warmup (VERIFY's `warmup_ttft_ms`) apart from steady state (OBSERVE's `window`, `baseline`
    and `verdict`), and the parts not measured."""
    missing: list[str] = []
    warmup: dict[str, float] = {}
    verify = _evidence(steps, "verify") or {}
    first = verify.get("warmup_ttft_ms")
    if isinstance(first, int | float) and not isinstance(first, bool):
        warmup[engine] = float(first)
    elif kind in STARTS_ENGINE:
        missing.append("latency.warmup_ttft_ms: VERIFY recorded no first request's TTFT")
    observed = _evidence(steps, "observe")
    if observed is None:
        missing.append("latency.steady: no OBSERVE step ran (observe_seconds 0)")
        return LatencyRecord(warmup_ttft_ms=warmup), missing
    try:
        steady = _model(WindowSummary, observed.get("window"))
        baseline = _model(WindowSummary, observed.get("baseline"))
        verdict = _model(WindowVerdict, observed.get("verdict"))
    except ValidationError as exc:
        missing.append(
            f"latency.steady: OBSERVE's window is not a traffic window ({exc.error_count()} errors)"
        )
        return LatencyRecord(warmup_ttft_ms=warmup), missing
    if steady is None:
        why = (
            observed.get("not_applicable")
            or observed.get("skipped")
            or observed.get("error")
            or "OBSERVE recorded no window"
        )
        missing.append(f"latency.steady: {why}")
    return LatencyRecord(warmup_ttft_ms=warmup, steady=steady, baseline=baseline, verdict=verdict), missing


def _model(model: type[M], body: Any) -> M | None:
    return model.model_validate(body) if isinstance(body, dict) else None


def memory_of(
    engine: str, before: EngineReading, after: EngineReading
) -> tuple[list[MemoryDelta], list[str]]:
    """GPU memory before and after (and host memory, where the engine reports its weight backup);
    a side not read is None, and both not read is a section not measured."""
    b, a = before.memory, after.memory
    if b is None and a is None:
        return [], [f"memory: {before.memory_unread}"]
    source = b.source if b is not None else a.source if a is not None else ""
    deltas = [_delta(engine, source, "gpu", b.gpu_bytes if b else None, a.gpu_bytes if a else None)]
    host_before, host_after = (b.host_bytes if b else None), (a.host_bytes if a else None)
    if host_before is not None or host_after is not None:
        deltas.append(_delta(engine, source, "host", host_before, host_after))
    missing = []
    if b is None or a is None:
        side, why = ("before", before.memory_unread) if b is None else ("after", after.memory_unread)
        missing.append(f"memory {side}: {why}")
    return deltas, missing


def _delta(engine: str, source: str, pool: str, before: int | None, after: int | None) -> MemoryDelta:
    delta = after - before if before is not None and after is not None else None
    return MemoryDelta(
        engine=engine, source=source, pool=pool, before_bytes=before, after_bytes=after, delta_bytes=delta
    )


def ranks_of(engine: str, before: EngineReading, after: EngineReading) -> tuple[RankChange, list[str]]:
    """The engine's ranks when the operation began and when it ended; a side with no engine is None
    and named in `not_measured`."""
    missing = [
        f"ranks {side}: no engine process"
        for side, reading in (("before", before), ("after", after))
        if reading.ranks is None
    ]
    return RankChange(engine=engine, before=before.ranks, after=after.ranks), missing


def rollback_point(
    kind: str, supervisor: str, engine: str, before: EngineReading, after: EngineReading
) -> RollbackPoint:
    """Where undoing this operation goes back to: the bundle the engine ran before it and the command
    that returns it to the state before (empty when it is there already, or nothing can undo it)."""
    at = f"--supervisor {supervisor}"
    command = ""
    if kind == "sleep" and after.sleep_level is not None:
        command = f"corral wake {at}" + (" --reload" if after.sleep_level == 2 else "")
    elif kind == "wake" and before.sleep_level is not None and after.sleep_level is None:
        command = f"corral sleep {at} --level {before.sleep_level}"
    elif kind == "lora_load":
        added = sorted(set(after.adapters) - set(before.adapters))
        command = " && ".join(f"corral lora unload {at} {shlex.quote(n)}" for n in added)
    elif kind == "lora_unload":
        removed = sorted(set(before.adapters) - set(after.adapters))
        command = " && ".join(
            f"corral lora load {at} {shlex.quote(n)} {shlex.quote(before.adapters[n])}" for n in removed
        )
    elif kind in ("switch_bundle", "rollback") and before.bundle and after.bundle != before.bundle:
        command = f"corral switch-bundle {at} {shlex.quote(str(before.bundle.get('name')))}"
    return RollbackPoint(bundles={engine: before.bundle}, command=command)


@dataclass(frozen=True)
class Operation:
    """What the record says of the operation itself."""

    kind: str
    id: str | None
    engine: str  # the engine's URL: the key of `from_bundles`, `memory` and `warmup_ttft_ms`
    supervisor: str  # the management URL, for the rollback command
    outcome: str
    reason: str = ""


def assemble(
    op: Operation,
    steps: Sequence[dict[str, Any]],
    before: EngineReading,
    after: EngineReading,
    forced: Sequence[dict[str, Any]] | None,
) -> ChangeRecord:
    """The change record from the steps and the two readings; `forced` is the gate's forced exits
    during the operation (None: no gate)."""
    timed = step_records(steps, before.at)
    latency, missing = latency_of(op.kind, op.engine, timed)
    memory, unread = memory_of(op.engine, before, after)
    missing += unread
    ranks, no_ranks = ranks_of(op.engine, before, after)
    missing += no_ranks
    if op.outcome == REFUSED:
        return _refused(op, timed, before)
    failures = request_failures(before.gate, after.gate)
    if failures is None:
        missing.append(NO_GATE_FAILURES)
    exits: list[ForcedExit] | None = None
    if forced is None:
        missing.append(NO_GATE_EXITS)
    else:
        exits = [ForcedExit.model_validate(e) for e in forced[:FORCED_EXITS_LISTED]]
        if len(forced) > FORCED_EXITS_LISTED:
            missing.append(
                f"forced_exits: {len(forced) - FORCED_EXITS_LISTED} more not listed (the oplog's "
                "forced_exit records name each)"
            )
    return ChangeRecord(
        kind=op.kind,
        id=op.id,
        corral_version=__version__,
        started=timed[0].started if timed else before.at,
        finished=after.at,
        outcome=op.outcome,
        reason=op.reason,
        from_bundles={op.engine: before.bundle},
        to_bundle=after.bundle,
        steps=timed,
        request_failures=failures,
        memory=memory,
        latency=latency,
        rollback_point=rollback_point(op.kind, op.supervisor, op.engine, before, after),
        forced_exits=exits,
        ranks=ranks,
        preload=preload_of(timed),
        not_measured=missing,
    )


def _refused(op: Operation, steps: list[StepRecord], before: EngineReading) -> ChangeRecord:
    """PRECHECK turned the operation down: nothing changed, so there is nothing to measure or undo."""
    return ChangeRecord(
        kind=op.kind,
        id=op.id,
        corral_version=__version__,
        started=steps[0].started if steps else before.at,
        finished=time.time(),
        outcome=REFUSED,
        reason=op.reason,
        from_bundles={op.engine: before.bundle},
        to_bundle=before.bundle,
        steps=steps,
        not_measured=["every section: PRECHECK refused the operation before it changed anything"],
    )


def management_url(host: str, port: int) -> str:
    """The supervisor's management address as a person (or `corral … --supervisor`) reaches it."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ChangeWitness:
    """Reads the engine when a runbook operation begins (`__init__` before PRECHECK, `begin` for the
    memory once the engine is held) and when it ends (`close`), and leaves the operation's change
    record in the oplog."""

    def __init__(self, sup: EngineAccess, kind: str) -> None:
        self._sup = sup
        self.kind = kind
        self.before = read_engine(sup)

    def _operation(self, op_id: str | None, outcome: str, reason: str) -> Operation:
        config = self._sup.config
        supervisor = management_url(config.host, config.port)
        return Operation(self.kind, op_id, config.engine_url, supervisor, outcome, reason)

    async def begin(self) -> None:
        self.before = await read_memory(self._sup, self.before)

    def refused(self, op_id: str | None, reason: str, precheck_started: float) -> ChangeRecord:
        """The record of an operation PRECHECK (or the operation lock) turned down, in the oplog."""
        seconds = time.monotonic() - precheck_started
        step = {
            "step": "precheck",
            "status": "failed",
            "started": round(time.time() - seconds, 4),
            "seconds": round(seconds, 4),
            "evidence": {"error": reason},
        }
        record = assemble(self._operation(op_id, REFUSED, reason), [step], self.before, self.before, None)
        record = self._traced(record)
        self._sup.oplog.append("change_record", **record.to_file())
        return record

    async def close(
        self, op_id: str, steps: Sequence[dict[str, Any]], failure: str | None = None
    ) -> ChangeRecord:
        """The record of the run that ended (`failure`: why it failed), written to the oplog."""
        sup = self._sup
        after = await read_memory(sup, read_engine(sup))
        gate, mark = sup.gate, self.before.forced_mark
        forced = None
        if gate is not None and mark is not None:
            forced = [exit.to_json() for exit in gate.requests.forced_since(mark)]
        outcome = FAILED if failure is not None else SUCCEEDED
        record = assemble(self._operation(op_id, outcome, failure or ""), steps, self.before, after, forced)
        record = self._traced(record)
        sup.oplog.append("change_record", **record.to_file())
        return record

    def _traced(self, record: ChangeRecord) -> ChangeRecord:
        """The record with its trace's id, when traces are exported (the trace is written now)."""
        traces = self._sup.record_traces
        return record if traces is None else traces.traced(record)
