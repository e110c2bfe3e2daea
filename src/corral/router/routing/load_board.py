"""What the engines last said about their own load, scraped from their `/metrics`, and how old it is.

Scorers read it on the request path without any I/O; `LoadScraper` fills it in the background.
An entry older than `stale_after` (or none at all) counts as saturated: a router must not prefer an
engine because it stopped answering its metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class EngineLoad:
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0  # 0..1
    running_adapters: frozenset[str] = frozenset()
    at: float = 0.0  # time.monotonic() of the scrape


@dataclass(slots=True)
class LoadBoard:
    stale_after: float = 1.0
    loads: dict[str, EngineLoad] = field(default_factory=dict)

    def to_json(self, url: str, now: float) -> dict[str, float] | None:
        """`/v1/fleet`'s `load` of an endpoint: its last fresh figures (None: none, or stale)."""
        load = self.fresh(url, now)
        if load is None:
            return None
        return {"running": load.running, "waiting": load.waiting, "kv_usage": round(load.kv_usage, 4)}

    def fresh(self, url: str, now: float | None = None) -> EngineLoad | None:
        """The engine's last load if it is recent enough, else None (saturated)."""
        load = self.loads.get(url)
        if load is None:
            return None
        if (time.monotonic() if now is None else now) - load.at > self.stale_after:
            return None
        return load
