"""Two branches of `corral doctor`'s tree for a sleeping engine that the plain "sleeping" branch would
hide: a partial wake (some memory tags woken, the engine still sleeping and unroutable) and memory
not released (the sleep is reported, but the GPU memory figures did not fall, or the sleep's VERIFY
found the device's memory held). Read from the supervisor's sleep status and memory verdict and the
engine's `vllm:engine_sleep_state` and memory figures.
"""

from __future__ import annotations

from typing import Any

from corral.engine.dev_api import EngineFigures, parse_figures
from corral.engine.metric_names import SLEEP_STATE
from corral.engine_state import EngineState
from corral.fleet.checks.probe import EngineView

PARTIAL_WAKE = "not-ready/partial-wake"
MEMORY_NOT_RELEASED = "memory/not-released"
_LEVEL_OF_STATE = {"weights_offloaded": 1, "discard_all": 2}
GIB = 2**30


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value / GIB:.2f} GiB"


def engine_figures(e: EngineView) -> EngineFigures | None:
    return parse_figures(e.metrics) if e.metrics else None


def _sleep(e: EngineView) -> dict[str, Any]:
    value = (e.state or {}).get("sleep")
    return value if isinstance(value, dict) else {}


def _wake_command(e: EngineView, level: Any, asleep: list[str]) -> str:
    reload = " --reload" if level == 2 and "weights" in asleep else ""
    tags = ",".join(asleep) if asleep else "weights,kv_cache"
    if e.supervisor_url is None:
        return (
            f"run the engine under `corral supervise`, then finish the wake: corral wake --supervisor URL "
            f"--tags {tags}{reload}"
        )
    return (
        f"finish the wake: corral wake {e.cli_address} --tags {tags}{reload} "
        "(or without --tags; it ends with VERIFY, a smoke request and READY)"
    )


def partial_wake(e: EngineView) -> tuple[str, str, str] | None:
    """(branch, evidence, next command) when the engine sleeps with some memory tags woken."""
    if not e.sleeping:
        return None
    sleep = _sleep(e)
    woken = [str(t) for t in sleep.get("woken_tags") or []]
    if woken:
        asleep = [str(t) for t in sleep.get("asleep_tags") or []]
        evidence = (
            f"supervisor {e.lifecycle} ({(e.state or {}).get('sub_state')}): level {sleep.get('level')} "
            f"sleep with {woken} woken, {asleep or 'nothing'} still asleep; /is_sleeping true, not routable"
        )
        return PARTIAL_WAKE, evidence, _wake_command(e, sleep.get("level"), asleep)
    figures = engine_figures(e)
    level = _LEVEL_OF_STATE.get(str(figures.sleep_state)) if figures is not None else None
    if figures is None or level is None:
        return None
    weights, kv = figures.gpu_weights_bytes, figures.gpu_kv_cache_bytes
    if weights is None or kv is None or bool(weights) == bool(kv):
        return None
    asleep = ["kv_cache"] if weights else ["weights"]
    evidence = (
        f"/is_sleeping true, {SLEEP_STATE} {figures.sleep_state}, but GPU weights "
        f"{_gib(weights)} and KV cache {_gib(kv)}: {asleep[0]} still asleep, the rest woken "
        "(a wake_up with tags, not through the supervisor)"
    )
    return PARTIAL_WAKE, evidence, _wake_command(e, level, asleep)


def _last_memory(e: EngineView) -> dict[str, Any]:
    memory = (e.state or {}).get("memory")
    last = memory.get("last") if isinstance(memory, dict) else None
    return last if isinstance(last, dict) else {}


def _device_not_released(e: EngineView) -> tuple[str, str, str] | None:
    """Without engine figures: the sleep's VERIFY read the device (NVML) and found memory held."""
    last = _last_memory(e)
    if last.get("operation") != "sleep" or last.get("outcome") != "failed":
        return None
    command = (
        "check who holds the memory (nvidia-smi --query-compute-apps=pid,used_memory --format=csv); "
        "was the engine started with --enable-sleep-mode? A residue above --sleep-residue-gib that is "
        "only CUDA graphs or NCCL buffers: raise it (corral supervise --sleep-residue-gib)"
    )
    return MEMORY_NOT_RELEASED, f"the sleep's VERIFY ({last.get('source')}): {last.get('reason')}", command


def memory_note(e: EngineView) -> str:
    """What a sleeping engine's branch adds when its memory could not be measured (never "freed")."""
    last = _last_memory(e)
    if last.get("outcome") != "not_measured":
        return ""
    return f"; GPU memory not measured ({last.get('reason')})"


def memory_not_released(e: EngineView) -> tuple[str, str, str] | None:
    """(branch, evidence, next command) when a sleep is reported but the GPU memory is still held."""
    if not e.sleeping:
        return None
    figures = engine_figures(e)
    if figures is None or figures.gpu_weights_bytes is None:
        return _device_not_released(e)
    sleep = _sleep(e)
    level = sleep.get("level") if e.lifecycle == EngineState.SLEEPING else None
    if level is None:
        level = _LEVEL_OF_STATE.get(str(figures.sleep_state))
    should_free: list[tuple[str, float | None]] = []
    if level in (1, 2):
        should_free = [("weights", figures.gpu_weights_bytes), ("KV cache", figures.gpu_kv_cache_bytes)]
    elif sleep.get("kv_released"):
        should_free = [("KV cache", figures.gpu_kv_cache_bytes)]
    held = [(name, value) for name, value in should_free if value]
    if not held:
        return None
    before = sleep.get("before") if isinstance(sleep.get("before"), dict) else {}
    was = (
        f" (before the sleep: weights {_gib(before.get('gpu_weights_bytes'))}, "
        f"KV cache {_gib(before.get('gpu_kv_cache_bytes'))})"
        if before
        else ""
    )
    evidence = (
        f"asleep at level {level} ({SLEEP_STATE} {figures.sleep_state}) but still holding "
        + ", ".join(f"{name} {_gib(value)}" for name, value in held)
        + was
    )
    where = f"corral wake --supervisor {e.supervisor_url}" if e.supervisor_url else f"{e.engine_url}/wake_up"
    command = (
        "the engine freed nothing: was it started with --enable-sleep-mode (and not zero-copy preload)? "
        "Check who holds the memory (nvidia-smi --query-compute-apps=pid,used_memory --format=csv), "
        f"then wake it ({where}) and restart it with --enable-sleep-mode before sleeping again"
    )
    return MEMORY_NOT_RELEASED, evidence, command
