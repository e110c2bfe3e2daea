"""What a LoRA load or unload did to the engine's memory and KV capacity (seed 004, LoRA VERIFY).

Read before EXECUTE and again in VERIFY:
- GPU memory: the engine's own figures where it reports them (`corral sim`'s gauges), else NVML over
  the engine's processes (`change_record.read_memory`), else "not measured" with why (a CPU engine, no
  NVML): never a silent pass.
- KV capacity: `vllm:cache_config_info`'s `num_gpu_blocks` (`engine/kv_config.py`), a figure vLLM
  states itself, on GPU and CPU alike.

The judgement:
- KV capacity, load and unload: vLLM sizes its KV cache once, at start, after reserving what
  `--max-loras` adapters of `--max-lora-rank` take; an adapter loaded at run time goes into one of
  those slots. So an operation that leaves fewer blocks than `KV_SHRINK_BOUND` allows (none fewer)
  failed, with both figures.
- Memory, load: recorded (before, after, the growth), and the growth remembered for the unload. vLLM
  keeps a loaded adapter's weights in host memory and copies them into a preallocated GPU slot, so
  on vLLM the growth is about nil.
- Memory, unload: it must free what its load was seen to take (less `MEMORY_TOLERANCE_BYTES`), and
  never leave the engine holding more than before it; either is a failure with the figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from corral.engine.kv_config import KvBlocks, kv_blocks
from corral.engine.metric_names import CACHE_CONFIG_INFO
from corral.supervisor.lifecycle.device_memory import GIB
from corral.supervisor.lifecycle.memory_checks import FAILED, NOT_MEASURED, PASSED, MemoryVerdict
from corral.supervisor.runbook.change_record import MemoryReading, read_engine, read_memory
from corral.supervisor.runbook.template import Evidence, StepFailed

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess

# The share of the KV cache an adapter operation may take away: none (see the module's docstring).
KV_SHRINK_BOUND = 0.0
# What an unload may leave unfreed of its load's growth, or add: allocator noise on one GPU.
MEMORY_TOLERANCE_BYTES = 64 * 2**20
METRICS_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Footprint:
    """The engine's GPU memory and KV cache at one moment; None with why where nothing said."""

    memory: MemoryReading | None
    memory_unread: str
    kv: KvBlocks | None
    kv_unread: str

    def memory_json(self) -> dict[str, Any] | None:
        m = self.memory
        return None if m is None else {"source": m.source, "gpu_bytes": m.gpu_bytes}


async def read_kv(session: aiohttp.ClientSession, engine_url: str) -> tuple[KvBlocks | None, str]:
    """The engine's KV cache as its `/metrics` states it, or None and why not."""
    try:
        async with session.get(
            engine_url.rstrip("/") + "/metrics", timeout=aiohttp.ClientTimeout(total=METRICS_TIMEOUT_S)
        ) as resp:
            body = await resp.read()
            if resp.status != 200:
                return None, f"not measured: GET /metrics answered HTTP {resp.status}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return None, f"not measured: GET /metrics failed ({exc or type(exc).__name__})"
    found = kv_blocks(body)
    if found is None:
        return None, f"not measured: the engine's /metrics states no {CACHE_CONFIG_INFO} num_gpu_blocks"
    return found, ""


async def read_footprint(sup: EngineAccess) -> Footprint:
    reading = await read_memory(sup, read_engine(sup))
    kv, kv_unread = await read_kv(sup.session, sup.config.engine_url)
    return Footprint(reading.memory, _not_measured(reading.memory_unread), kv, kv_unread)


def _not_measured(why: str) -> str:
    return why if why.startswith("not measured") else f"not measured: {why}"


def _gib(n: int) -> str:
    return f"{n / GIB:+.3f} GiB" if n else "0 GiB"


def kv_verdict(kind: str, before: Footprint, after: Footprint, bound: float = KV_SHRINK_BOUND) -> Evidence:
    """KV capacity before and after; `outcome` failed when the operation took more than `bound` of it."""
    if before.kv is None or after.kv is None:
        why = before.kv_unread if before.kv is None else after.kv_unread
        return {"outcome": NOT_MEASURED, "reason": why, "before": _kv(before), "after": _kv(after)}
    was, now = before.kv.num_gpu_blocks, after.kv.num_gpu_blocks
    figures = {"before": before.kv.to_json(), "after": after.kv.to_json(), "bound": bound}
    if now < was * (1.0 - bound):
        cut = (was - now) / was if was else 1.0
        reason = (
            f"{kind} cut the KV cache from {was:,} to {now:,} blocks ({cut:.1%}), more than the "
            f"{bound:.0%} allowed: vLLM reserves adapter memory at start, so an adapter must not take KV "
            "blocks; check --max-loras / --max-lora-rank and the engine's log"
        )
        return {"outcome": FAILED, "reason": reason, **figures}
    return {"outcome": PASSED, "reason": f"KV cache {was:,} → {now:,} blocks", **figures}


def _kv(footprint: Footprint) -> dict[str, Any] | None:
    return footprint.kv.to_json() if footprint.kv is not None else None


def _comparable(before: Footprint, after: Footprint) -> tuple[MemoryReading, MemoryReading] | str:
    if before.memory is None or after.memory is None:
        return before.memory_unread if before.memory is None else after.memory_unread
    if before.memory.source != after.memory.source:
        return f"not measured: read from {before.memory.source} before and {after.memory.source} after"
    return before.memory, after.memory


def load_memory_verdict(before: Footprint, after: Footprint) -> MemoryVerdict:
    """The load's growth, recorded (a load is not judged on memory: see the module's docstring)."""
    pair = _comparable(before, after)
    figures = {"before": before.memory_json(), "after": after.memory_json()}
    if isinstance(pair, str):
        return MemoryVerdict(NOT_MEASURED, pair, None, figures)
    was, now = pair
    growth = now.gpu_bytes - was.gpu_bytes
    return MemoryVerdict(
        PASSED, f"GPU memory {_gib(growth)} by the load", was.source, {**figures, "growth_bytes": growth}
    )


def unload_memory_verdict(
    before: Footprint, after: Footprint, load_growth: int | None, tolerance: int = MEMORY_TOLERANCE_BYTES
) -> MemoryVerdict:
    """Did the unload free memory: what its load took (`load_growth`, where it was seen), and no growth."""
    pair = _comparable(before, after)
    figures: dict[str, Any] = {
        "before": before.memory_json(),
        "after": after.memory_json(),
        "load_growth_bytes": load_growth,
        "tolerance_bytes": tolerance,
    }
    if isinstance(pair, str):
        return MemoryVerdict(NOT_MEASURED, pair, None, figures)
    was, now = pair
    freed = was.gpu_bytes - now.gpu_bytes
    figures["freed_bytes"] = freed
    if freed < -tolerance:
        reason = f"the unload did not free memory: the engine holds {_gib(-freed)} more after it"
        return MemoryVerdict(FAILED, reason, was.source, figures)
    if load_growth is not None and load_growth > tolerance and freed < load_growth - tolerance:
        reason = (
            f"the unload did not free memory: its load took {_gib(load_growth)}, the unload freed "
            f"{_gib(freed)}"
        )
        return MemoryVerdict(FAILED, reason, was.source, figures)
    return MemoryVerdict(PASSED, f"GPU memory {_gib(-freed)} by the unload", was.source, figures)


def judge(sup: EngineAccess, kind: str, memory: MemoryVerdict, kv: Evidence) -> Evidence:
    """Record the memory verdict on the supervisor; raise VERIFY's failure with both figures."""
    sup.note_memory(kind, memory)
    checked: Evidence = {"memory": memory.to_json(), "kv_capacity": kv}
    if memory.failed:
        raise StepFailed(memory.reason, **checked)
    if kv["outcome"] == FAILED:
        raise StepFailed(str(kv["reason"]), **checked)
    return checked
