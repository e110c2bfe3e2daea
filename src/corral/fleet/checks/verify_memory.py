"""`corral verify`'s memory checks, read from each supervisor's `/v1/state` `memory`: its last memory
verdict (at READY, or the VERIFY of its last sleep, wake or reload; figures from the engine or NVML)
and vLLM's logged KV cache size against the memory budget. Each answers passed, failed or
not_measured; a check nothing could measure is never reported as passed. Also each engine's memory
now against the last change record's, for the record's `memory` section."""

from __future__ import annotations

from typing import Any

from corral.contracts.records import MemoryDelta
from corral.engine.dev_api import parse_figures
from corral.fleet.checks.probe import EngineView

PASSED, FAILED, NOT_MEASURED = "passed", "failed", "not_measured"
ENGINE_METRICS, NVML = "engine_metrics", "nvml"  # where a memory figure came from (the supervisor's names)


def _memory(e: EngineView) -> dict[str, Any] | None:
    value = (e.state or {}).get("memory")
    return value if isinstance(value, dict) else None


def _supervised(engines: list[EngineView]) -> list[EngineView]:
    return [e for e in engines if e.state is not None]


def _outcome(failed: list[str], unmeasured: list[str], passed: list[str]) -> tuple[str, str]:
    if failed:
        return FAILED, "; ".join(failed + unmeasured)
    if unmeasured:
        measured = f"; measured: {', '.join(passed)}" if passed else ""
        return NOT_MEASURED, "; ".join(unmeasured) + measured
    return PASSED, ", ".join(passed)


def memory_outcome(engines: list[EngineView]) -> tuple[str, str] | None:
    """(outcome, detail) over every supervisor's last memory verdict; None without supervisors."""
    supervised = _supervised(engines)
    if not supervised:
        return None
    failed: list[str] = []
    unmeasured: list[str] = []
    passed: list[str] = []
    for e in supervised:
        memory = _memory(e)
        last = (memory or {}).get("last")
        if not isinstance(last, dict):
            why = "no memory verdict yet" if memory is not None else "the supervisor reports no memory"
            unmeasured.append(f"{e.name}: {why}")
            continue
        where = f"{e.name} {last.get('operation')}"
        outcome = last.get("outcome")
        if outcome == FAILED:
            failed.append(f"{where}: {last.get('reason')}")
        elif outcome == PASSED:
            passed.append(f"{where} ({last.get('source')}): {last.get('reason')}")
        else:
            unmeasured.append(f"{where}: {last.get('reason')}")
    return _outcome(failed, unmeasured, passed)


def kv_capacity_outcome(engines: list[EngineView]) -> tuple[str, str] | None:
    """(outcome, detail) of vLLM's logged KV size against each engine's memory budget."""
    supervised = _supervised(engines)
    if not supervised:
        return None
    failed: list[str] = []
    unmeasured: list[str] = []
    passed: list[str] = []
    for e in supervised:
        capacity = (_memory(e) or {}).get("kv_capacity")
        if not isinstance(capacity, dict):
            unmeasured.append(f"{e.name}: no KV capacity check (not READY since it started)")
            continue
        line = f"{e.name}: {capacity.get('reason')}"
        {FAILED: failed, PASSED: passed}.get(str(capacity.get("outcome")), unmeasured).append(line)
    return _outcome(failed, unmeasured, passed)


def resident_bytes(e: EngineView) -> tuple[str, int] | None:
    """(source, bytes) the engine holds now: its own figures (`corral sim`'s gauges: weights and KV
    cache), else its supervisor's last NVML reading; None when neither says."""
    if e.metrics:
        try:
            figures = parse_figures(e.metrics)
        except ValueError:
            figures = None
        if figures is not None and figures.gpu_weights_bytes is not None:
            return ENGINE_METRICS, round(figures.gpu_weights_bytes + (figures.gpu_kv_cache_bytes or 0.0))
    last = (_memory(e) or {}).get("last")
    if isinstance(last, dict) and last.get("source") == NVML:
        reading = last.get("after") or last.get("reading")
        total = reading.get("total_bytes") if isinstance(reading, dict) else None
        if isinstance(total, int | float):
            return NVML, round(total)
    return None


def _recorded(record: dict[str, Any] | None) -> dict[str, int]:
    """engine name -> bytes after, from a change record's `memory` section."""
    found: dict[str, int] = {}
    for entry in (record or {}).get("memory") or []:
        if isinstance(entry, dict) and isinstance(entry.get("after_bytes"), int):
            found[str(entry.get("engine"))] = entry["after_bytes"]
    return found


def memory_deltas(
    engines: list[EngineView], previous: dict[str, Any] | None
) -> tuple[list[MemoryDelta], str]:
    """Each engine's memory now against what `previous` (the last change record) recorded for it, and
    why there is none when no engine's could be read ("" when some could)."""
    before = _recorded(previous)
    deltas: list[MemoryDelta] = []
    for e in engines:
        now = resident_bytes(e)
        if now is None:
            continue
        source, after = now
        was = before.get(e.name)
        delta = after - was if was is not None else None
        deltas.append(
            MemoryDelta(engine=e.name, source=source, before_bytes=was, after_bytes=after, delta_bytes=delta)
        )
    if deltas or not engines:
        return deltas, "" if deltas else "no engine to read"
    return (
        deltas,
        "no engine reports its memory (vLLM has no memory gauge) and no supervisor has an NVML reading",
    )
