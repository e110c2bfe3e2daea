"""An engine's GPU memory as its supervisor last measured it (`/v1/state` `memory.last`: at READY, or
after the last sleep, wake or reload; from the simulator's gauges or NVML): the one reading of it that
a rollout's record, its canary and `corral verify`'s observed window take."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.contracts.supervisor import SupervisorState


@dataclass(frozen=True)
class EngineMemory:
    """One engine's GPU memory as its supervisor last measured it, and from what."""

    source: str  # engine_metrics (the engine's own gauges: corral sim) | nvml
    held_bytes: int


def memory_in(memory: Any) -> tuple[EngineMemory | None, str]:
    """The figure in a `/v1/state` `memory` section, or None and why not."""
    last = memory.get("last") if isinstance(memory, dict) else None
    if not isinstance(last, dict):
        why = "no memory verdict yet" if isinstance(memory, dict) else "the supervisor reports no memory"
        return None, why
    figures, reading = last.get("figures"), last.get("after") or last.get("reading")
    if last.get("source") == "engine_metrics" and isinstance(figures, dict):
        weights, kv = figures.get("gpu_weights_bytes"), figures.get("gpu_kv_cache_bytes")
        if isinstance(weights, int | float):
            held = weights + (kv if isinstance(kv, int | float) else 0)
            return EngineMemory("engine_metrics", int(held)), ""
    if last.get("source") == "nvml" and isinstance(reading, dict):
        total = reading.get("total_bytes")
        if isinstance(total, int) and total > 0:
            return EngineMemory("nvml", total), ""
    return None, str(last.get("reason") or f"no figure in its last memory verdict ({last.get('operation')})")


def memory_of(state: SupervisorState) -> tuple[EngineMemory | None, str]:
    """The engine's memory from its supervisor's state, or None and why not."""
    return memory_in((state.model_extra or {}).get("memory"))
