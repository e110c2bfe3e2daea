"""The accelerators a host has and what the engine's processes hold on them, read through NVML
(`nvidia-ml-py`, imported as `pynvml`) where the library and a driver are present. Every reader
answers None when NVML is not there, so a caller says "not measured" instead of guessing."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

_lock = threading.Lock()


@dataclass(frozen=True)
class GpuDevice:
    """One accelerator: NVML index, UUID, model name, total and free memory in bytes."""

    index: int
    uuid: str
    model: str
    total_bytes: int
    free_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "model": self.model,
            "total_bytes": self.total_bytes,
            "free_bytes": self.free_bytes,
        }


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@contextmanager
def _nvml() -> Iterator[Any | None]:
    """NVML initialised for the block, or None when the library or the driver is missing."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    with _lock:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            yield None
            return
        try:
            yield pynvml
        finally:
            pynvml.nvmlShutdown()


def read_gpus() -> list[GpuDevice] | None:
    """Every GPU NVML sees (after CUDA_VISIBLE_DEVICES, as NVML does not apply it: the caller
    filters), or None when NVML is not available on this host."""
    with _nvml() as nvml:
        if nvml is None:
            return None
        devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append(
                GpuDevice(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    model=_text(nvml.nvmlDeviceGetName(handle)),
                    total_bytes=int(memory.total),
                    free_bytes=int(memory.free),
                )
            )
        return devices


def gpu_processes() -> dict[str, dict[int, int]] | None:
    """Per GPU UUID, the processes NVML lists on it and the bytes each holds (compute and graphics
    contexts both count), or None when NVML is not available. The PIDs are the driver's: in a
    container with its own PID namespace they are the host's, not the ones `ps` shows here."""
    with _nvml() as nvml:
        if nvml is None:
            return None
        listed: dict[str, dict[int, int]] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            procs = listed.setdefault(_text(nvml.nvmlDeviceGetUUID(handle)), {})
            for getter in (
                nvml.nvmlDeviceGetComputeRunningProcesses,
                nvml.nvmlDeviceGetGraphicsRunningProcesses,
            ):
                for proc in getter(handle):
                    if proc.pid not in procs and proc.usedGpuMemory is not None:
                        procs[int(proc.pid)] = int(proc.usedGpuMemory)
        return listed


def held_by(listed: dict[str, dict[int, int]], pids: Iterable[int]) -> dict[str, int]:
    """Bytes the given processes hold per GPU UUID (GPUs where they hold none are left out)."""
    wanted = set(pids)
    held = {uuid: sum(b for pid, b in procs.items() if pid in wanted) for uuid, procs in listed.items()}
    return {uuid: b for uuid, b in held.items() if b}
