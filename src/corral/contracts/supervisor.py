"""The supervisor's state API: `GET /v1/state`, the lines of `GET /v1/state/watch` (a state line per
event, an operation line per runbook step, a heartbeat when nothing happened) and a router's
acknowledgement (`POST /v1/acks`) with the record the supervisor answers it with."""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import Field, ValidationError, field_validator

from corral.contracts.operations import OperationRecord
from corral.contracts.wire import OpenWireModel, WireModel
from corral.engine_state import EngineState

ROUTER_ID_MAX = 200
# a bundle name on a state line longer than this is dropped (read as absent): issue 32
BUNDLE_NAME_MAX = 128


def _state_or_none(value: Any) -> EngineState | None:
    """A state this version knows, else None (a newer peer's state is not an error where it is
    only reported)."""
    try:
        return EngineState(value)
    except ValueError:
        return None


class OperationInFlight(WireModel):
    """The runbook operation holding an engine: its kind (`sleep`), id (None during PRECHECK), what
    was asked in a few words (`level 1`), the step it is in (`drain_policy`) and since when (the
    supervisor's wall clock). Absent from supervisors before issue 18."""

    kind: str
    id: str | None = None
    detail: str | None = None
    step: str
    since: float | None = None


def read_operation(value: Any) -> OperationInFlight | None:
    """An operation as a newer or older peer sent it; one this version cannot read is left out."""
    if isinstance(value, OperationInFlight):
        return value
    try:
        return OperationInFlight.model_validate(value) if isinstance(value, dict) else None
    except ValidationError:
        return None


class StateLine(WireModel):
    """One state event (or the current state, as a watch stream's first line). Readers need `epoch`
    and `state`; every other field is read leniently, as the router always has."""

    type: Literal["state"] = "state"
    epoch: int
    from_: EngineState | None = Field(default=None, alias="from")
    to: EngineState | None = None
    state: EngineState
    sub_state: str | None = None
    ready: bool = False
    reason: str = ""
    evidence: dict[str, Any] = Field(default_factory=dict)
    time: float | None = None
    since: float | None = None
    fingerprint: str | None = None  # the running bundle's; absent from supervisors before issue 14
    # the running bundle's name (`corral status` prints it); absent before issue 32, None when not a
    # string or longer than BUNDLE_NAME_MAX
    bundle_name: str | None = None
    # changes whenever the engine's prefix cache may have been emptied (reset, new engine process);
    # compared for equality only; absent from supervisors before issue 14
    prefix_epoch: str | None = None
    # prefill | decode | both, and the P/D pairing identity (engine/pd_protocol.pairing_identity over
    # the running bundle's parts); absent from supervisors before issue 16
    role: str | None = None
    pairing: str | None = None
    # the engine's KV connector (`kv_connector` of its --kv-transfer-config): how a prefill answer hands
    # the KV over (engine/pd_protocol.handoff_of); absent without a connector and before issue 17
    connector: str | None = None
    # where the engine publishes its KV-cache events, `PUB[,REPLAY]` ZMQ addresses a router connects to
    # (engine/kv_events_address, from its --kv-events-config); absent without events and before issue 17
    kv_events: str | None = None
    operation: OperationInFlight | None = None  # the runbook operation in flight (issue 18)

    @field_validator("operation", mode="before")
    @classmethod
    def _operation(cls, value: Any) -> OperationInFlight | None:
        return read_operation(value)

    @field_validator("from_", "to", mode="before")
    @classmethod
    def _known_state(cls, value: Any) -> EngineState | None:
        return _state_or_none(value)

    @field_validator("sub_state", "fingerprint", mode="before")
    @classmethod
    def _sub_state(cls, value: Any) -> str | None:
        return value if isinstance(value, str) else None

    @field_validator("bundle_name", mode="before")
    @classmethod
    def _bundle_name(cls, value: Any) -> str | None:
        return value if isinstance(value, str) and len(value) <= BUNDLE_NAME_MAX else None

    @field_validator("reason", mode="before")
    @classmethod
    def _reason(cls, value: Any) -> str:
        return str(value)

    @field_validator("prefix_epoch", "role", "pairing", "connector", "kv_events", mode="before")
    @classmethod
    def _prefix_epoch(cls, value: Any) -> str | None:
        return value if isinstance(value, str) else None

    @field_validator("evidence", mode="before")
    @classmethod
    def _evidence(cls, value: Any) -> dict[str, Any]:
        return value if isinstance(value, dict) else {}

    @field_validator("time", "since", mode="before")
    @classmethod
    def _seconds(cls, value: Any) -> float | None:
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    @property
    def withdrawn_adapters(self) -> frozenset[str]:
        """The models a READY line withdraws from routing (a LoRA adapter about to be unloaded)."""
        listed = self.evidence.get("withdrawn_adapters")
        return frozenset(m for m in listed if isinstance(m, str)) if isinstance(listed, list) else frozenset()


class Heartbeat(WireModel):
    """Nothing happened for a heartbeat interval; the stream is alive."""

    type: Literal["heartbeat"] = "heartbeat"
    epoch: int
    time: float


class OperationLine(WireModel):
    """A runbook operation began a step (`operation`), or ended (`operation` None). Not a state
    event: it moves no epoch and changes no routing; a reader before issue 18 ignores it."""

    type: Literal["operation"] = "operation"
    epoch: int | None = None
    time: float | None = None
    operation: OperationInFlight | None = None

    @field_validator("operation", mode="before")
    @classmethod
    def _operation(cls, value: Any) -> OperationInFlight | None:
        return read_operation(value)


WatchLine = StateLine | Heartbeat | OperationLine


class NotJSON(ValueError):
    """A watch line that is not JSON: the stream is broken."""


class UnusableLine(ValueError):
    """A state line without a usable epoch or state; the line is skipped, the stream goes on."""

    def __init__(self, line: object, why: str) -> None:
        super().__init__(why)
        self.line = line


def decode_watch_line(raw: bytes) -> WatchLine | None:
    """One line of `/v1/state/watch`: a `StateLine`, a `Heartbeat`, or None for a line of a kind
    this version does not know (ignored, like a JSON value that is not an object)."""
    try:
        line = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise NotJSON(f"not a JSON line: {raw[:100]!r}") from None
    if not isinstance(line, dict):
        return None
    kind = line.get("type")
    try:
        if kind == "state":
            return StateLine.model_validate(line)
        if kind == "heartbeat":
            return Heartbeat.model_validate(line)
        if kind == "operation":
            return OperationLine.model_validate(line)
    except ValidationError as exc:
        raise UnusableLine(line, str(exc)) from None
    return None


class AckRequest(WireModel):
    """`POST /v1/acks`: the router has taken the engine out of its routing for `epoch` and every
    request it had picked for the engine has reached it (`undispatched` counts those that had not
    when it stopped waiting); for a prefill engine, every decode leg it started from the engine's KV
    transfers has reached its decode engine (`transfers_unconfirmed` counts those that had not).
    With `state` READY: the engine, back to READY at `epoch` after a removal, is in the router's
    routing table again."""

    router_id: str = Field(default=None, validate_default=True)
    epoch: int = Field(default=None, validate_default=True)
    state: EngineState | None = None
    removal_latency_s: float | None = None
    undispatched: int = 0
    transfers_unconfirmed: int = 0

    @field_validator("router_id", mode="before")
    @classmethod
    def _router_id(cls, value: Any) -> str:
        if not isinstance(value, str) or not value or len(value) > ROUTER_ID_MAX:
            raise ValueError(f"router_id must be a non-empty string of at most {ROUTER_ID_MAX} characters")
        return value

    @field_validator("epoch", mode="before")
    @classmethod
    def _epoch(cls, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"epoch must be a non-negative integer, not {value!r}")
        return value

    @field_validator("state", mode="before")
    @classmethod
    def _state(cls, value: Any) -> EngineState | None:
        return _state_or_none(value)

    @field_validator("removal_latency_s", mode="before")
    @classmethod
    def _latency(cls, value: Any) -> float | None:
        return float(value) if isinstance(value, int | float) else None

    @field_validator("undispatched", "transfers_unconfirmed", mode="before")
    @classmethod
    def _undispatched(cls, value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) else 0


class AckRecord(WireModel):
    """One acknowledgement as the supervisor recorded it (the answer to `POST /v1/acks`, and the
    entries of `/v1/state`'s `routers.acks`)."""

    router_id: str
    epoch: int
    received: float  # the supervisor's wall clock
    latency_s: float | None = None  # from the supervisor's event of that epoch to the acknowledgement
    state: EngineState | None = None
    removal_latency_s: float | None = None  # router side: line read -> out of its routing table
    undispatched: int = 0
    transfers_unconfirmed: int = 0  # decode legs from the engine's transfers not confirmed at decode

    @field_validator("state", mode="before")
    @classmethod
    def _state(cls, value: Any) -> EngineState | None:
        return _state_or_none(value)


class EngineInfo(WireModel):
    url: str | None = None
    pid: int | None = None
    model: str | None = None
    argv: list[str] = Field(default_factory=list)


class BundleInfo(OpenWireModel):
    """The running bundle: its fingerprint and the parts it is computed from (kept as sent)."""

    fingerprint: str | None = None
    adapters: list[str] = Field(default_factory=list)


class AdapterInfo(OpenWireModel):
    """`/v1/state`'s `adapters`: the desired LoRA set (name -> path, from `--lora` and runtime loads),
    what the engine was last seen serving, and which of the desired ones runtime loads added."""

    desired: dict[str, str] = Field(default_factory=dict)
    served: list[str] = Field(default_factory=list)
    runtime: list[str] = Field(default_factory=list)


class RankInfo(WireModel):
    """One worker rank of the engine: its process as vLLM's log named it, and whether it lives (None
    for a pid outside the engine's process tree); `since` is when it was first seen, or found dead."""

    rank: int
    name: str
    pid: int
    alive: bool | None = None
    since: float | None = None


class SupervisorState(OpenWireModel):
    """`GET /v1/state`: the current state event with since-when, and what the supervisor knows of its
    engine. The sections a caller only shows are kept as they came."""

    state: EngineState
    epoch: int
    sub_state: str | None = None
    ready: bool = False
    reason: str = ""
    since: float | None = None
    time: float | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)
    engine: EngineInfo = Field(default_factory=EngineInfo)
    bundle: BundleInfo | None = None
    adapters: AdapterInfo = Field(default_factory=AdapterInfo)
    bundle_name: str | None = None
    bundles_declared: list[str] = Field(default_factory=list)
    on_startup_failure: str | None = None  # restart | stay-unready | rollback=BUNDLE (absent before issue 14)
    startup_failure: dict[str, Any] | None = None  # the last start that failed for good, and its verdict
    # the last PRECHECK: outcome, reason, fingerprint, authorized_at, checks (absent before issue 14)
    precheck: dict[str, Any] | None = None
    busy: str | None = None
    operation: OperationInFlight | None = None  # kind, id, detail, step, since (absent before issue 18)
    sleep: dict[str, Any] | None = None
    drain: dict[str, Any] | None = None
    routers: dict[str, Any] | None = None
    engine_evidence: dict[str, Any] | None = None
    # the engine's worker ranks and the world size (TP x PP x DP) its command asks for (issue 14)
    world_size: int | None = None
    ranks: list[RankInfo] = Field(default_factory=list)
    # prefill | decode | both and the P/D pairing identity (None until the bundle is known; issue 16)
    role: str | None = None
    pairing: str | None = None
    operations: list[OperationRecord] = Field(default_factory=list)
    # the GPU fault the engine's last run showed (kind, detail, line, xid/device, seen), the running
    # bundle's CUDA-graph/NCCL settings against the stable bundle's, and where Xids are read (issue 29)
    gpu_fault: dict[str, Any] | None = None
    graph_nccl_vs_stable: dict[str, Any] | None = None
    xid_sources: dict[str, Any] | None = None
    last_gpu_fault: dict[str, Any] | None = None  # the last run that showed one, kept across restarts

    @property
    def fingerprint(self) -> str:
        return str((self.bundle.fingerprint if self.bundle else None) or "")

    @property
    def progress(self) -> str:
        """One line for a terminal: state (sub-state in words, when there is one): reason."""
        sub = f" ({self.sub_state.replace('_', ' ')})" if self.sub_state else ""
        return f"{self.state}{sub}: {self.reason}"


LeftoverVerdict = Literal["clean", "found", "not_measured"]


class Leftover(WireModel):
    """One thing an operation left behind, named: a process (pid), a file or socket (path), and what
    it holds (bytes) where that is known."""

    kind: str
    what: str
    path: str | None = None
    pid: int | None = None
    bytes: int | None = None


class LeftoverCheck(WireModel):
    """One kind of leftover looked for: `clean` (looked, nothing there), `found` (named in `found`) or
    `not_measured` (could not look: never clean); `fails` says whether a find fails POSTCHECK."""

    kind: str
    verdict: LeftoverVerdict
    reason: str
    fails: bool = False
    found: list[Leftover] = Field(default_factory=list)


class LeftoverReport(WireModel):
    """`GET /v1/leftovers` and the `leftovers` evidence of a POSTCHECK: every kind looked for."""

    checked_at: float
    checks: list[LeftoverCheck] = Field(default_factory=list)

    @property
    def failures(self) -> list[LeftoverCheck]:
        return [c for c in self.checks if c.verdict == "found" and c.fails]

    @property
    def warnings(self) -> list[LeftoverCheck]:
        return [c for c in self.checks if c.verdict == "found" and not c.fails]

    def named(self, checks: list[LeftoverCheck] | None = None) -> str:
        """The leftovers of `checks` (default: every find) in one line."""
        chosen = checks if checks is not None else [c for c in self.checks if c.verdict == "found"]
        return "; ".join(f.what for c in chosen for f in c.found)
