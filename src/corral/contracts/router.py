"""The router's `GET /v1/fleet` (an admin route): its policy and identity, every endpoint it knows
with its routing verdict and supervisor stream, and the last endpoints that left routing."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from corral.contracts.supervisor import OperationInFlight
from corral.contracts.traffic import RequestCounts, TrafficFigures
from corral.contracts.wire import WireModel
from corral.engine_state import EngineState


class SupervisorLink(WireModel):
    """What the router has from an endpoint's supervisor state stream."""

    url: str
    stream: str = "connecting"  # connecting | connected | stale | lost
    stream_reason: str = ""
    state: EngineState | None = None
    sub_state: str | None = None
    reason: str = ""
    epoch: int | None = None
    heard_seconds_ago: float | None = None
    acked_epoch: int | None = None
    acks_sent: int = 0
    role: str | None = None  # what the supervisor's state stream says (issue 16)
    pairing: str | None = None
    connector: str | None = None  # the engine's KV connector, as its supervisor says (issue 17)
    kv_events: str | None = None  # where the engine publishes KV events, as its supervisor says (issue 17)
    # the runbook operation in flight and its step, as the supervisor's stream last said (issue 18;
    # None from an older supervisor, or none in flight)
    operation: OperationInFlight | None = None


class SlowStartRamp(WireModel):
    """An endpoint's slow start: when it last became routable (wall clock), the share of its full
    share it may take now (0.1 .. 1), and the requests it has taken during this ramp."""

    since: float
    weight: float = 1.0
    taken: int = 0


class FleetEndpoint(WireModel):
    """One endpoint as the router routes it; `routable` and `why` are its verdict now."""

    url: str
    source: str = ""
    name: str | None = None
    state: EngineState = EngineState.STARTING
    reason: str = ""
    since: float | None = None
    last_event_resource_version: str | None = None
    models: list[str] = Field(default_factory=list)
    in_flight: int = 0
    requests_sent: int = 0
    ejected_until: float | None = None
    routable: bool = False
    why: str = ""
    supervisor: SupervisorLink | None = None
    slow_start: SlowStartRamp | None = None  # None: slow start off
    # what the router saw of this endpoint's answers since it was first listed (contracts/traffic.py);
    # None from a router that does not count them
    traffic: TrafficFigures | None = None
    # prefill | decode | both as routing uses it (the supervisor's word, else the declared role), and
    # the P/D pairing identity (None: unknown, paired with nothing); absent before issue 16
    role: str = "both"
    pairing: str | None = None
    # the router's subscription to the engine's KV events and what its index holds from them (issue 17:
    # endpoint, replay, last_seq, batches, gaps, replays, lost, restarts, index.blocks, ...); None when
    # the router does not read the engine's events
    kv_events: dict[str, Any] | None = None
    # the LoRA adapters the engine serves, as its /v1/models lists them (a card with a `parent`), and
    # those its supervisor withdrew from routing before an unload; absent before issue 18
    adapters: list[str] = Field(default_factory=list)
    withdrawn: list[str] = Field(default_factory=list)

    @property
    def supervisor_url(self) -> str:
        return self.supervisor.url if self.supervisor is not None else ""


class RoutingExitRecord(WireModel):
    """One endpoint leaving routing: removed, or no longer READY."""

    url: str
    source: str = ""
    name: str | None = None
    kind: str = ""  # removed | unroutable
    cause: str = ""
    reason: str = ""
    event_resource_version: str | None = None
    at: float | None = None
    at_monotonic: float | None = None
    requests_sent: int = 0


class OperationStepRecord(WireModel):
    """An engine's runbook operation began a step, or ended (`step` None, `ended` True), as the
    router heard it on the supervisor's stream; `at` is the router's clock (absent before issue 18)."""

    url: str
    name: str | None = None
    kind: str = ""
    id: str | None = None
    detail: str | None = None
    step: str | None = None
    ended: bool = False
    at: float | None = None


class ModelPairs(WireModel):
    """For one model served in a prefill or decode role: the routable prefill and decode endpoints
    (`both` counts for either), the compatible (prefill, decode) pairs they make, the prefill endpoints
    that have none, and why there is no pair when there is none."""

    model: str
    prefill_routable: int = 0
    decode_routable: int = 0
    pairs: int = 0
    unpaired_prefill: list[str] = Field(default_factory=list)
    why: str = ""


class RouterFleet(WireModel):
    """`GET /v1/fleet`."""

    policy: str = ""
    router_id: str | None = None
    source: str = ""
    endpoints: list[FleetEndpoint] = Field(default_factory=list)
    left_routing: list[RoutingExitRecord] = Field(default_factory=list)
    operation_steps: list[OperationStepRecord] = Field(default_factory=list)  # the last 20 (issue 18)
    totals: RequestCounts | None = None  # the router's own counters, all endpoints and models
    pairs: list[ModelPairs] = Field(default_factory=list)  # P/D pairs per model (issue 16)

    @field_validator("endpoints", "left_routing", "operation_steps", "pairs", mode="before")
    @classmethod
    def _objects_only(cls, value: Any) -> list[Any]:
        # what readers always did: a listed value that is not an object is skipped
        return [e for e in value if isinstance(e, dict | WireModel)] if isinstance(value, list) else []

    @classmethod
    def from_body(cls, body: Any) -> RouterFleet:
        """A `/v1/fleet` body; a bare list of endpoints (an older router's) is read as its endpoints."""
        return cls.model_validate({"endpoints": body} if isinstance(body, list) else body)

    def by_url(self) -> dict[str, FleetEndpoint]:
        return {e.url: e for e in self.endpoints}
