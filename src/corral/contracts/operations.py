"""The supervisor's operations: the request bodies of `POST /v1/{drain,shutdown,sleep,wake,reload,
bundle,lora/load,lora/unload}` and the operation record every one of them (and `GET
/v1/operations/{id}`) answers with. An `operation_id` (or the `Idempotency-Key` header) names one
run: asking again with it joins that run. A runbook operation's body may add `observe_seconds` and the
thresholds of its OBSERVE window (`ObservedRequest`).

The request validators raise the messages the supervisor answers a bad body with (HTTP 400)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

from pydantic import Field, field_validator

from corral.contracts.traffic import WindowThresholds
from corral.contracts.wire import OpenWireModel, WireModel

OBSERVE_SECONDS_MAX = 3600.0


class OperationStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class OperationStep(OpenWireModel):
    """One step of a runbook operation as it ran (PRECHECK … POSTCHECK, RECOVER)."""

    step: str
    status: str  # done | failed
    seconds: float
    evidence: dict[str, Any] = Field(default_factory=dict)


class ForcedExit(OpenWireModel):
    """A request the engine's side ended before its answer was complete, as the admission gate saw it:
    `how` is cut (the engine stopped or its connection failed), engine_abort (finished with reason
    abort) or open_after_exit (still open at the gate after the engine's exit)."""

    request_id: str
    path: str
    model: str | None = None
    started: float
    tokens_emitted: bool
    how: str
    ended: float | None = None


class DrainResult(OpenWireModel):
    """What a finished drain reports; the fields a caller decides on are typed, the rest kept.
    `forced_exits` is None when nothing could observe them (no admission gate: see
    `forced_exits_unobserved`), never an empty list standing for "unknown"."""

    routers_missing: list[str] = Field(default_factory=list)
    acknowledged_after_s: float | None = None
    forced_exits: list[ForcedExit] | None = None
    forced_exits_not_listed: int = 0
    forced_exits_unobserved: str | None = None


class OperationRecord(WireModel):
    """One operation run: `GET /v1/operations/{id}`, and the answer to the request that started it
    (202) or joined it (200)."""

    operation_id: str
    kind: str
    status: OperationStatus = OperationStatus.RUNNING
    started: float
    finished: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.status is not OperationStatus.RUNNING

    @property
    def succeeded(self) -> bool:
        return self.status is OperationStatus.SUCCEEDED

    @property
    def steps(self) -> list[OperationStep]:
        """A runbook operation's steps, in the order they ran ([] for drain and shutdown)."""
        listed = (self.result or {}).get("steps")
        return [OperationStep.model_validate(s) for s in listed] if isinstance(listed, list) else []

    def drain_result(self) -> DrainResult:
        return DrainResult.model_validate(self.result or {})


class OperationRequest(WireModel):
    """What every operation request may carry: the id that makes it idempotent. `route` is where it
    is posted."""

    route: ClassVar[str]
    operation_id: str | None = None

    @field_validator("operation_id", mode="before")
    @classmethod
    def _operation_id(cls, value: Any) -> str | None:
        # the supervisor reads the id (body, else Idempotency-Key) before the body, with its own message
        return value if isinstance(value, str) and value else None

    def body(self) -> dict[str, Any]:
        """The JSON body: every field that has a value (an absent one takes the server's default)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class DrainRequest(OperationRequest):
    route = "/v1/drain"
    policy: str | None = None

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, value: Any) -> str | None:
        if value not in ("wait", "abort"):  # an explicit null too
            raise ValueError(f"policy {value!r}: use wait or abort")
        return str(value)


class ObservedRequest(OperationRequest):
    """A runbook operation's request: `observe_seconds` S > 0 closes it with OBSERVE, one window of S
    seconds of the engine's traffic after POSTCHECK compared with its PRECHECK baseline; the
    thresholds not given default to `WindowThresholds`'."""

    observe_seconds: float | None = None
    max_error_ratio: float | None = None
    max_ttft_ratio: float | None = None
    max_itl_ratio: float | None = None
    min_requests: int | None = None

    @field_validator("observe_seconds", "max_error_ratio", "max_ttft_ratio", "max_itl_ratio", mode="before")
    @classmethod
    def _observe_figure(cls, value: Any, info: Any) -> float | None:
        if value is None:
            return None
        name = info.field_name
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} must be a number, not {value!r}")
        low, high, what = {
            "observe_seconds": (0.0, OBSERVE_SECONDS_MAX, "seconds (0: no OBSERVE)"),
            "max_error_ratio": (0.0, 1.0, "an error ratio"),
            "max_ttft_ratio": (1.0, 1000.0, "how many times the baseline's TTFT p99"),
            "max_itl_ratio": (1.0, 1000.0, "how many times the baseline's ITL p99"),
        }[name]
        if not low <= value <= high:
            raise ValueError(f"{name} must be {what} from {low:g} to {high:g}, not {value!r}")
        return float(value)

    @field_validator("min_requests", mode="before")
    @classmethod
    def _min_requests(cls, value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"min_requests must be a whole number of requests, at least 1, not {value!r}")
        return value

    def thresholds(self) -> WindowThresholds:
        """The thresholds asked for, the others at their defaults."""
        asked = {
            "max_error_ratio": self.max_error_ratio,
            "max_ttft_ratio": self.max_ttft_ratio,
            "max_itl_ratio": self.max_itl_ratio,
            "min_requests": self.min_requests,
        }
        return WindowThresholds.model_validate({k: v for k, v in asked.items() if v is not None})


class SleepRequest(ObservedRequest):
    route = "/v1/sleep"
    level: int = 1
    mode: str = "wait"
    release_kv: bool = False

    @field_validator("level", mode="before")
    @classmethod
    def _level(cls, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"level must be 0, 1 or 2, not {value!r}")
        return value

    @field_validator("mode", "release_kv", mode="before")
    @classmethod
    def _mode_release(cls, value: Any, info: Any) -> Any:
        wanted = str if info.field_name == "mode" else bool
        if not isinstance(value, wanted):
            raise ValueError("mode must be a string and release_kv a boolean")
        return value


class WakeRequest(ObservedRequest):
    route = "/v1/wake"
    tags: list[str] | None = None
    reload: bool = False

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, value: Any) -> list[str] | None:
        if value is not None and not (isinstance(value, list) and all(isinstance(t, str) for t in value)):
            raise ValueError(f"tags must be a list of strings, not {value!r}")
        return value or None

    @field_validator("reload", mode="before")
    @classmethod
    def _reload(cls, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError("reload must be a boolean")
        return value


class ReloadRequest(ObservedRequest):
    route = "/v1/reload"
    mode: str = "wait"

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError("mode must be a string")
        return value


class SwitchBundleRequest(ObservedRequest):
    route = "/v1/bundle"
    name: str = Field(default=None, validate_default=True)
    ready_timeout: float | None = None

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise ValueError(f"name must name a bundle declared on this host, not {value!r}")
        return value

    @field_validator("ready_timeout", mode="before")
    @classmethod
    def _within(cls, value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"ready_timeout must be seconds, not {value!r}")
        if value <= 0:
            raise ValueError(f"ready_timeout must be above 0, not {value!r}")
        return value


class LoadAdapterRequest(ObservedRequest):
    """The plan checks the name and path (its messages name the adapter): read as sent."""

    route = "/v1/lora/load"
    name: Any = None
    adapter_path: Any = Field(default=None, alias="path")


class UnloadAdapterRequest(ObservedRequest):
    route = "/v1/lora/unload"
    name: Any = None
