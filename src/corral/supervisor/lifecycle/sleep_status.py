"""What the engine's sleep is while the supervisor has it SLEEPING: the level and mode it went to
sleep with, what it released, and, after a partial wake, which memory tags are awake again. The
runbook operations set it through the supervisor; `/v1/state` shows it as `sleep`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SleepStatus:
    level: int
    mode: str
    kv_released: bool
    before: dict[str, Any] | None = None  # the engine's memory figures before the sleep
    reloading: bool = False  # a weight reload's level-2 sleep, not one asked for
    woken_tags: tuple[str, ...] | None = None  # after a partial wake
    asleep_tags: tuple[str, ...] | None = None
    device_before: dict[str, Any] | None = None  # NVML's reading before the sleep (no engine figures)
    reason: str | None = None  # why it sleeps when the supervisor chose it ("idle 300 s"); None: asked

    def partially_awake(self, woken: list[str], asleep: list[str]) -> SleepStatus:
        return dataclasses.replace(self, woken_tags=tuple(woken), asleep_tags=tuple(asleep))

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"level": self.level, "mode": self.mode, "kv_released": self.kv_released}
        if self.reloading:
            body["reloading"] = True
        else:
            body["before"] = self.before
        if self.woken_tags is not None:
            body["woken_tags"] = list(self.woken_tags)
        if self.asleep_tags is not None:
            body["asleep_tags"] = list(self.asleep_tags)
        if self.device_before is not None:
            body["device_before"] = self.device_before
        if self.reason is not None:
            body["reason"] = self.reason
        return body
