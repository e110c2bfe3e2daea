"""A drain's or shutdown's change record (`contracts.records.ChangeRecord`, the schema every runbook
operation's record has): the drain report's steps timed (leave routing, the policy, the engine's stop),
the requests its stop cut or aborted as the admission gate named them, the gate's counters before
and after, and the bundle the engine ran. The engine is stopped at the end: nothing runs after it
(`to_bundle` None) and its memory went with its process (not read)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from corral import __version__
from corral.contracts.operations import ForcedExit
from corral.contracts.records import ChangeRecord, RequestFailures, RollbackPoint, StepRecord
from corral.contracts.traffic import RequestCounts

if TYPE_CHECKING:
    from corral.bundle_spec import BundleSpec
    from corral.supervisor.checks.bundle import Bundle
    from corral.supervisor.lifecycle.drain import DrainReport
    from corral.supervisor.lifecycle.operations import Operation

NO_GATE_FAILURES = (
    "request_failures: no admission gate (--gate-port): the router's counters are read by fleet "
    "operations (rollout, verify)"
)
STOPPED_MEMORY = "memory: the engine's memory went with its stopped process (not read)"


def bundle_of(running: BundleSpec, bundle: Bundle | None) -> dict[str, Any]:
    """The engine's bundle as a change record names it: its name and fingerprint (None before the
    first READY computed one)."""
    return {"name": running.name, "fingerprint": bundle.fingerprint if bundle is not None else None}


def request_failures(before: RequestCounts | None, after: RequestCounts | None) -> RequestFailures | None:
    """The gate's counters over the operation (None: no gate)."""
    if before is None or after is None:
        return None
    return RequestFailures(source="gate", before=before, after=after, during=after.minus(before))


def _steps(report: DrainReport, started: float) -> list[StepRecord]:
    """Each step's start is the drain's start plus the steps before it (the report keeps durations)."""
    left = report.removal_epoch is not None
    routing: dict[str, Any] = {
        "removal_epoch": report.removal_epoch,
        "quiet_reached": report.quiet_reached,
        "arrivals_while_leaving": report.arrivals_while_leaving,
        "routers_missing": report.routers_missing,
        "routers_gone": report.routers_gone,
    }
    steps = [
        ("remove_from_routing", report.propagation_seconds, not report.routers_missing, routing),
        (
            "drain_policy",
            report.drain_seconds,
            report.in_flight_drained or report.policy != "wait" or not left,
            {
                "policy": report.policy,
                "in_flight_drained": report.in_flight_drained,
                "gate_open_at_end": report.gate_open_at_end,
            },
        ),
        *_transfers_step(report.transfers),
        (
            "stop_engine",
            report.stop_seconds,
            not report.engine_killed,
            {"engine_exit_code": report.engine_exit_code, "engine_killed": report.engine_killed},
        ),
    ]
    timed, at = [], started
    for name, seconds, ok, data in steps:
        detail = report.cut_short if name == "stop_engine" else None
        if not left and name != "stop_engine":
            detail = "; ".join(report.notes) or "the engine was not in routing"
        timed.append(
            StepRecord(
                step=name,
                started=round(at, 4),
                seconds=round(seconds, 4),
                ok=ok,
                detail=detail or "",
                data=data,
            )
        )
        at += seconds
    return timed


def _transfers_step(transfers: dict[str, Any] | None) -> list[tuple[str, float, bool, dict[str, Any]]]:
    """A disaggregated engine's transfer wait as a step (none for an aggregated engine): ok unless it
    ended at its bound with transfers still held or pulls still running."""
    if transfers is None:
        return []
    left = (transfers.get("held_at_end") or 0) + (transfers.get("pulls_at_end") or 0)
    ok = not (transfers.get("ended") == "bound" and left > 0)
    return [("wait_transfers", float(transfers.get("waited_s") or 0.0), ok, transfers)]


def drain_change_record(
    op: Operation,
    report: DrainReport,
    engine: str,
    bundle: dict[str, Any],
    before: RequestCounts | None,
    after: RequestCounts | None,
) -> ChangeRecord:
    """`op` (drain | shutdown) from its report; `before`/`after` the gate's counts (None: no gate)."""
    missing = [STOPPED_MEMORY]
    failures = request_failures(before, after)
    if failures is None:
        missing.append(NO_GATE_FAILURES)
    exits = None
    if report.forced_exits is None:
        missing.append(f"forced_exits: {report.forced_exits_unobserved or 'not observed'}")
    else:
        exits = [ForcedExit.model_validate(e) for e in report.forced_exits]
    if report.forced_exits_not_listed:
        missing.append(
            f"forced_exits: {report.forced_exits_not_listed} more not listed (the oplog's forced_exit "
            "records name each)"
        )
    if report.transfers is not None:
        missing.extend(f"transfers: {why}" for why in report.transfers.get("not_measured", []))
    steps = _steps(report, op.started)
    return ChangeRecord(
        kind=op.kind,
        id=op.id,
        corral_version=__version__,
        started=op.started,
        finished=time.time(),
        outcome="succeeded",
        reason=report.cut_short or "",
        from_bundles={engine: bundle},
        to_bundle=None,
        steps=steps,
        request_failures=failures,
        rollback_point=RollbackPoint(bundles={engine: bundle}, command=""),
        forced_exits=exits,
        not_measured=missing,
    )
