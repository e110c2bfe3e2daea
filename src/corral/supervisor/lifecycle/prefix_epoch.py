"""The engine's prefix-cache epoch as the supervisor publishes it on every state line: a token that changes
whenever the engine's prefix cache may have been emptied (a new engine process, or a reset after the wake of
a level-1/2 sleep or a KV release, a reload, or RECOVER from a sleep that failed), so a router forgets the
prefixes it believed that engine holds. It also keeps
the last reset, for `/v1/state`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.supervisor.lifecycle.engine_process import EngineProcess


class PrefixCacheEpoch:
    """How many times the running engine's prefix cache was reset, and the last reset."""

    def __init__(self) -> None:
        self.resets = 0
        self.last: dict[str, Any] | None = None

    def note_reset(self, why: str, evidence: dict[str, Any]) -> None:
        """The engine's prefix cache was emptied (by it, or by us): the epoch moves on."""
        self.resets += 1
        self.last = {"why": why, "at": time.time(), **evidence}

    def token(self, engine: EngineProcess | None) -> str:
        """`<engine pid>:<resets>`: compared for equality only; `-` for the pid while no engine runs."""
        pid = engine.pid if engine is not None and engine.running else None
        return f"{pid if pid is not None else '-'}:{self.resets}"

    def to_json(self, engine: EngineProcess | None) -> dict[str, Any]:
        return {"epoch": self.token(engine), "resets": self.resets, "last_reset": self.last}
