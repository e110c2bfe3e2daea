"""Change records: the JSON file one fleet operation (`corral verify`, `rollout`, `rollback`) leaves
behind (`~/.corral/<kind>-<port>.json`), which the next operation reads back and a person audits.
Each kind keeps the fields it adds beyond the typed ones."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from corral.contracts.wire import OpenWireModel, WireModel
from corral.engine_state import EngineState


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


class ChangeRecord(OpenWireModel):
    """What every change record holds."""

    kind: str  # verify | rollout | rollback
    started: float
    finished: float
    router: str | None = None


class VerifyRecord(ChangeRecord):
    kind: str = "verify"
    supervisors: list[str] = Field(default_factory=list)
    engines: list[EngineRecord] = Field(default_factory=list)
    ok: bool | None = None
    failed: list[str] = Field(default_factory=list)
    checks: list[dict[str, Any]] = Field(default_factory=list)
    ttft_ms: float | None = None


class RolloutStepRecord(OpenWireModel):
    """One rollout step, timed; `data` is there only when the step kept evidence."""

    step: str
    group: str | None = None
    started: float
    seconds: float = 0.0
    ok: bool = False
    detail: str = ""


class RolloutRecord(ChangeRecord):
    """A rollout's or rollback's record; rollback reads `from_bundles` back from it."""

    id: str
    outcome: str
    reason: str = ""
    to_bundle: dict[str, Any] | None = None
    from_bundles: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    settings: dict[str, int] = Field(default_factory=dict)
    replaced: list[dict[str, Any]] = Field(default_factory=list)
    fingerprints: dict[str, str] = Field(default_factory=dict)
    steps: list[RolloutStepRecord] = Field(default_factory=list)
