"""The control API of a running `corral up` (what `corral rollout` and `corral rollback` use there):
`GET /v1/groups`, `POST /v1/groups`, `DELETE /v1/groups/{name}`; errors are `{"error": {"message",
"code"}}`."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from corral.bundle_spec import BundleSpec, bundle_from_json
from corral.contracts.wire import WireModel

GROUP_SIZE_MAX = 64


class GroupMember(WireModel):
    """One supervised engine of a serving group."""

    name: str
    group: str
    supervisor: str
    engine: str
    role: str = "both"  # prefill | decode | both (absent before issue 16: both)
    pid: int | None = None
    running: bool = False
    bundle: dict[str, Any] | None = None
    adapters: list[str] = Field(default_factory=list)  # LoRA adapters served once its group was added
    log: str = ""


class ServingGroup(WireModel):
    """A serving group: the engines of one bundle, started together. `bundle` is the bundle's JSON
    as `corral.bundle_spec` writes it; `bundle_spec()` reads it."""

    name: str
    bundle: dict[str, Any] | None = None
    role: str = "both"  # prefill | decode | both: every member's (absent before issue 16: both)
    members: list[GroupMember] = Field(default_factory=list)

    def bundle_spec(self) -> BundleSpec | None:
        """The group's bundle; `BundleError` when it is not one."""
        return bundle_from_json(self.bundle, f"group {self.name}") if self.bundle else None

    @property
    def supervisors(self) -> list[str]:
        return [m.supervisor for m in self.members]

    @property
    def engines(self) -> list[str]:
        return [m.engine for m in self.members]


class GroupList(WireModel):
    """`GET /v1/groups`: the fleet's router and every serving group."""

    router: str | None = None
    groups: list[ServingGroup] = Field(default_factory=list)


class AddGroupRequest(WireModel):
    """`POST /v1/groups`: start `size` engines of `bundle` in `role`, each serving the LoRA `adapters`
    (name -> path; absent: the union of the fleet's groups' desired sets) before the router hears of
    it; 201 with the `ServingGroup` once every one is READY and routed, 422 with the reason if not."""

    bundle: Any  # read by `corral.bundle_spec.bundle_from_json`, whose messages name the field
    size: int | None = None  # absent: the fleet's group size
    startup_timeout: float | None = None  # absent: the fleet's
    adapters: dict[str, str] | None = None
    role: str = "both"  # prefill | decode | both (corral.engine.pd_protocol.ROLES; the fleet checks it)

    @field_validator("adapters", mode="before")
    @classmethod
    def _adapters(cls, value: Any) -> dict[str, str] | None:
        if value is None:
            return None
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()
        ):
            raise ValueError(f"adapters {value!r}: a mapping of adapter name to path, both non-empty strings")
        return value

    @field_validator("size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= GROUP_SIZE_MAX:
            raise ValueError(f"size {value!r}: a whole number of engines from 1 to {GROUP_SIZE_MAX}")
        return value

    @field_validator("startup_timeout", mode="before")
    @classmethod
    def _within(cls, value: Any) -> float | None:
        if value is None:
            return None
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"startup_timeout {value!r}: seconds, above 0 (or leave it out: the fleet's)")
        return value


class RetiredGroup(WireModel):
    """`DELETE /v1/groups/{name}`: the group's engines stopped, with their exit codes."""

    name: str
    exit_codes: dict[str, int | None] = Field(default_factory=dict)  # member name -> exit code
