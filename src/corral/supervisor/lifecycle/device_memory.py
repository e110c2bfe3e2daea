"""What the engine's processes hold on each GPU at one moment, read through NVML over the engine's
process tree: vLLM's EngineCore and per-rank workers hold the memory, not the API server. VERIFY's
decisions over such readings are in `memory_checks.py`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from corral.engine.gpus import GpuDevice, gpu_processes, held_by, read_gpus

GIB = 2**30
NVML = "nvml"  # a reading's source

ProcessLister = Callable[[], "dict[str, dict[int, int]] | None"]  # engine.gpus.gpu_processes
DeviceLister = Callable[[], "list[GpuDevice] | None"]  # engine.gpus.read_gpus


def engine_pids(pid: int) -> list[int]:
    """The engine's process and all its descendants that still run (empty when it is gone)."""
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.Error:
        return []


@dataclass(frozen=True)
class DeviceReading:
    """Bytes held per GPU UUID at one moment (NVML): by the engine's process tree (`scope` process),
    or, where NVML's PIDs are another namespace's (a container), used on the engine's GPUs (`device`:
    any other process on them counts too)."""

    gpus: dict[str, int]
    pids: tuple[int, ...]
    scope: str = "process"

    @property
    def total_bytes(self) -> int:
        return sum(self.gpus.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "source": NVML,
            "scope": self.scope,
            "gpus": dict(self.gpus),
            "gpus_gib": {uuid: round(held / GIB, 3) for uuid, held in self.gpus.items()},
            "total_bytes": self.total_bytes,
            "pids": list(self.pids),
        }

    @classmethod
    def from_json(cls, body: Any) -> DeviceReading | None:
        if not isinstance(body, dict) or not isinstance(body.get("gpus"), dict):
            return None
        gpus = {str(k): int(v) for k, v in body["gpus"].items()}
        return cls(gpus, tuple(body.get("pids") or ()), str(body.get("scope") or "process"))


def visible_devices(env: Mapping[str, str]) -> set[str] | None:
    """The GPUs `CUDA_VISIBLE_DEVICES` names (indices or UUIDs), None when it is not set."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return {v.strip() for v in value.split(",") if v.strip()}


def engine_visible_devices(engine_env: tuple[tuple[str, str], ...]) -> set[str] | None:
    """The GPUs the engine sees: its own environment (a bundle's env) over the supervisor's."""
    return visible_devices({**os.environ, **dict(engine_env)})


def _visible(gpu: GpuDevice, visible: set[str] | None) -> bool:
    return visible is None or str(gpu.index) in visible or any(gpu.uuid.startswith(v) for v in visible)


def read_device_sync(
    pid: int | None,
    visible: set[str] | None = None,
    processes: ProcessLister = gpu_processes,
    devices: DeviceLister = read_gpus,
    also: Iterable[int] = (),
) -> DeviceReading | None:
    """NVML's view of the engine's process tree (and of `also`: its ranks seen before, which may have
    left the tree), or None without NVML or without an engine process. Where NVML lists processes none
    of which exists here, it sees another PID namespace (the engine in a container): the reading is
    then the memory used on the engine's GPUs (`visible`)."""
    if pid is None:
        return None
    pids = engine_pids(pid)
    if not pids:
        return None
    pids += [p for p in also if p not in pids and psutil.pid_exists(p)]
    listed = processes()
    if listed is None:
        return None
    held = held_by(listed, pids)
    foreign = [p for procs in listed.values() for p in procs if not psutil.pid_exists(p)]
    if held or not foreign:
        return DeviceReading(held, tuple(pids))
    gpus = [g for g in devices() or [] if _visible(g, visible)]
    used = {g.uuid: g.total_bytes - (g.free_bytes or 0) for g in gpus}
    return DeviceReading(used, tuple(pids), scope="device")


async def read_device(
    pid: int | None, visible: set[str] | None = None, also: Iterable[int] = ()
) -> DeviceReading | None:
    """`read_device_sync` off the event loop (NVML is a blocking C library)."""
    return await asyncio.to_thread(read_device_sync, pid, visible, also=list(also))
