"""What a rollout is asked to do and what it records: the job and its settings, a serving group as a
rollout sees it, and one timed step of the change record."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corral.bundle_spec import BundleSpec
from corral.clients.access import FleetAccess
from corral.contracts.up import GroupMember, ServingGroup
from corral.fleet.rollout.canary import CanarySettings


class StepFailed(Exception):
    """A rollout step did not reach its verified end; the message says what was seen."""


@dataclass(frozen=True)
class RolloutSettings:
    max_surge: int = 1  # serving groups started beyond the fleet's size at once
    max_unavailable: int = 0  # serving groups taken out before their replacement is up
    routed_timeout: float = 30.0  # for the router to list a new engine as routable, or drop an old one
    drain_timeout: float = 300.0  # for one group's confirmed drain (the supervisors bound each step)
    start_timeout: float = 600.0  # for one group's start (the fleet's own startup timeout applies too)
    # for RECOVER's start of the previous bundle: known to work, so given time even when the new
    # bundle's start timeout is short
    recover_timeout: float = 600.0
    canary: CanarySettings = field(default_factory=CanarySettings)  # seconds 0: no CANARY step
    # a prefill/decode fleet: usable engines of each role kept at every step (fleet/rollout/pd_plan.py)
    min_prefill: int = 1
    min_decode: int = 1

    @property
    def batch(self) -> int:
        return self.max_surge or self.max_unavailable


@dataclass(frozen=True)
class RolloutJob:
    """What a rollout (or rollback) is asked to do, whatever runs the fleet's processes."""

    router: str
    target: BundleSpec
    settings: RolloutSettings
    kind: str = "rollout"  # or "rollback"
    supervisor_token: str | None = field(default=None, repr=False)  # where supervisors want one
    access: FleetAccess = field(default_factory=FleetAccess)  # the router's admin side, the engines' key
    # the record's rollback point: the command that undoes this change, and (a rollback) the record
    # of the rollout it undoes
    rollback_command: str = ""
    undoes: str | None = None


@dataclass
class Step:
    step: str
    group: str | None
    started: float = field(default_factory=time.time)
    seconds: float = 0.0
    ok: bool = False
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # kept in the change record as it is

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "group": self.group,
            "started": self.started,
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "detail": self.detail,
            **({"data": self.data} if self.data else {}),
        }


StepObserver = Callable[[Step, bool], None]  # (step, finished)


@dataclass
class Group:
    """A serving group as a rollout moves it: its bundle (read, so it compares with the target), its
    members and their role (prefill | decode | both)."""

    name: str
    bundle: BundleSpec | None
    members: list[GroupMember]
    role: str = "both"

    @classmethod
    def of(cls, group: ServingGroup) -> Group:
        return cls(group.name, group.bundle_spec(), list(group.members), group.role)

    @property
    def supervisors(self) -> list[str]:
        return [m.supervisor for m in self.members]

    @property
    def engines(self) -> list[str]:
        return [m.engine for m in self.members]
