"""`corral verify`'s memory checks, read from each supervisor's `/v1/state` `memory`: its last memory
verdict (at READY, or the VERIFY of its last sleep, wake or reload; figures from the engine or NVML)
and vLLM's logged KV cache size against the memory budget. Each answers passed, failed or
not_measured; a check nothing could measure is never reported as passed."""

from __future__ import annotations

from typing import Any

from corral.fleet.checks.probe import EngineView

PASSED, FAILED, NOT_MEASURED = "passed", "failed", "not_measured"


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
