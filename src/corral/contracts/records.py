"""Change records: the one schema every change Corral makes leaves behind — a fleet operation (`corral
verify`, `rollout`, `rollback`: `$XDG_STATE_HOME/corral/<kind>-<port>.json`) and a runbook operation
on one engine (sleep, wake, reload, switch_bundle, lora_load, lora_unload, shutdown: the operation's
result and its `change_record` oplog record). The next operation reads it back and a person audits it.

Seed 004 asks of every record: the operation and bundle versions, start and end, each step with its
timing, the request failures during the operation, the memory delta, warmup apart from steady-state
latency, the rollback point and the requests a forced exit cut. Each is a typed section here; a
section nothing could measure is None (or empty) and says so in `not_measured`, never a made-up zero.
Fields a kind adds beyond these are kept as they came (`OpenWireModel`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from corral.contracts.operations import ForcedExit
from corral.contracts.traffic import RequestCounts, WindowSummary, WindowVerdict
from corral.contracts.wire import OpenWireModel, WireModel
from corral.engine_state import EngineState

RECORD_SCHEMA = 2  # 1: the untyped records before issue 15 (read back as far as they go)


class EngineRecord(WireModel):
    """One engine as a verify saw it. `state` is its lifecycle state, or UNREACHABLE."""

    name: str
    supervisor: str | None = None
    engine: str | None = None
    state: EngineState | Literal["UNREACHABLE"] = "UNREACHABLE"
    epoch: int | None = None
    bundle: dict[str, Any] | None = None
    models: list[str] = Field(default_factory=list)
    adapters: list[str] = Field(default_factory=list)
    sleeping: bool | None = None
    health: int | None = None


class StepRecord(OpenWireModel):
    """One step, timed: `started` is wall-clock seconds, `seconds` its duration; `group` the serving
    group it acted on (None for a step on the record's own engine or the whole fleet); `data` the
    evidence it kept, when it kept any."""

    step: str
    group: str | None = None
    started: float
    seconds: float = 0.0
    ok: bool = False
    detail: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


class RequestFailures(WireModel):
    """Request failures during the operation: the router's counters read at its start and at its end
    (`during` is the difference). `source` is the router (or gate) they were read from."""

    source: str
    before: RequestCounts
    after: RequestCounts
    during: RequestCounts


class MemoryDelta(WireModel):
    """One engine's memory before and after the operation, in bytes, and where the figures came from
    (`nvml`, `engine_metrics`, `sim`); a figure not measured is None. `pool` is the memory measured:
    `gpu`, or `host` (the CPU backup a level-1 sleep moves the weights to)."""

    engine: str
    source: str
    pool: str = "gpu"
    before_bytes: int | None = None
    after_bytes: int | None = None
    delta_bytes: int | None = None
    # a rollout: the new engine that took this one's place (`after_bytes` is its first figure)
    replaced_by: str | None = None


class LatencyRecord(WireModel):
    """Warmup apart from steady state: `warmup_ttft_ms` is each started or woken engine's first
    request's TTFT; `steady` the window observed after the change, `baseline` what it was compared with
    (PRECHECK's window, the old groups', the last record's), `verdict` the comparison."""

    warmup_ttft_ms: dict[str, float] = Field(default_factory=dict)
    steady: WindowSummary | None = None
    baseline: WindowSummary | None = None
    verdict: WindowVerdict | None = None


class RankState(OpenWireModel):
    """An engine's worker ranks at one moment: the world size its command asks for (TP × PP × DP), the
    ranks on this host (`local`), how many its log showed and how many live, whether they are `whole`
    (every local rank seen and alive; `missing` says why not), the loss the rank watch named, if any,
    and each rank (`rank`, `name`, `pid`, `alive`, `since`)."""

    world_size: int
    local: int
    seen: int
    alive: int
    whole: bool
    missing: str | None = None
    lost: str | None = None
    ranks: list[dict[str, Any]] = Field(default_factory=list)


class RankChange(WireModel):
    """A runbook operation's engine ranks when it began and when it ended (None: no engine ran)."""

    engine: str
    before: RankState | None = None
    after: RankState | None = None


class RollbackPoint(WireModel):
    """Where a rollback of this change goes back to: the bundle(s) the fleet or engine ran before it,
    and the command that does it."""

    bundles: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    command: str = ""
    undoes: str | None = None  # a rollback: the record of the rollout it undid


class ChangeRecord(OpenWireModel):
    """Every change record. `kind` is verify | rollout | rollback or the runbook operation's kind;
    `outcome` succeeded | failed (| refused for a runbook operation PRECHECK turned down)."""

    schema_version: int = Field(default=RECORD_SCHEMA, alias="schema")
    kind: str
    id: str | None = None
    corral_version: str | None = None
    started: float
    finished: float
    outcome: str = ""
    reason: str = ""
    router: str | None = None
    # the fleet (and run of it) the record belongs to (corral.fleet_identity): `corral up` makes
    # both; None: a fleet that names none. A record without the field is from before issue 32.
    fleet_id: str | None = None
    fleet_run: str | None = None
    # the record's trace (32 hex digits) when traces were exported (corral.tracing.records); None: not traced
    trace_id: str | None = None
    from_bundles: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    to_bundle: dict[str, Any] | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    request_failures: RequestFailures | None = None
    memory: list[MemoryDelta] = Field(default_factory=list)
    latency: LatencyRecord = Field(default_factory=LatencyRecord)
    rollback_point: RollbackPoint | None = None
    forced_exits: list[ForcedExit] | None = None  # None: nothing could observe them
    # a runbook operation's: its engine's ranks before and after (None: a fleet record, or refused)
    ranks: RankChange | None = None
    # a bundle switch's preload daemon, {before, after: {argv, version, pid}, replaced, why} (None: no daemon)
    preload: dict[str, Any] | None = None
    not_measured: list[str] = Field(default_factory=list)  # sections nothing could measure, and why

    def to_file(self) -> dict[str, Any]:
        """The JSON-ready dict written to the record file."""
        return self.model_dump(mode="json", by_alias=True)


class VerifyRecord(ChangeRecord):
    kind: str = "verify"
    supervisors: list[str] = Field(default_factory=list)
    engines: list[EngineRecord] = Field(default_factory=list)
    ok: bool | None = None
    failed: list[str] = Field(default_factory=list)
    checks: list[dict[str, Any]] = Field(default_factory=list)
    ttft_ms: float | None = None  # the smoke request's TTFT (one probe, not a steady-state figure)
    # with --observe-seconds: each engine's window (by name) against the fleet's
    endpoint_windows: dict[str, WindowVerdict] = Field(default_factory=dict)


class RolloutRecord(ChangeRecord):
    """A rollout's or rollback's record; rollback reads `from_bundles` back from it."""

    settings: dict[str, Any] = Field(default_factory=dict)
    replaced: list[dict[str, Any]] = Field(default_factory=list)
    fingerprints: dict[str, str] = Field(default_factory=dict)
    adapters: dict[str, Any] = Field(default_factory=dict)
    canary: list[WindowVerdict] = Field(default_factory=list)  # one per new group that had a canary
    # per group replaced: the CUDA-graph/NCCL settings the new bundle changed from the one it replaced
    # (corral.engine.graph_nccl_flags), what a GPU fault after the rollout is first suspected of
    graph_nccl_changes: dict[str, list[dict[str, str]]] = Field(default_factory=dict)
