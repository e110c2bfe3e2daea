"""The GPUs an engine start will see, and where that was learned: the simulator's own device when the
engine is `corral sim`, NVML filtered by the engine's CUDA_VISIBLE_DEVICES, else what the supervisor
was told (`--gpus N --gpu-memory-gib G --gpu-model NAME`), else nothing ("not measured").

Order: a simulator touches no GPU, so its declared device is the truth for it whatever NVML says. On
a host with NVML the measurement wins over the declaration, and the declaration becomes an
expectation that `parallel_identity` checks (a pod scheduled onto smaller or other GPUs than the
bundle was sized for is refused, not started). Without NVML the declaration is all there is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.engine.flags import flag_value
from corral.engine.gpus import GpuDevice, read_gpus
from corral.engine.rank_lines import parallel_size

GIB = 1 << 30


class InventoryError(ValueError):
    """A GPU declaration or an engine flag that cannot describe a device."""


@dataclass(frozen=True)
class DeclaredGpus:
    """`--gpus N --gpu-memory-gib G --gpu-model NAME` on the supervisor: the GPUs this engine was
    sized for. Any part may be left out."""

    count: int | None = None
    memory_bytes: int | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if self.count is not None and self.count < 1:
            raise InventoryError(f"--gpus {self.count}: a start needs at least one GPU")
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise InventoryError(
                f"--gpu-memory-gib {self.memory_bytes / GIB:g}: give the device memory in GiB, > 0"
            )

    @property
    def given(self) -> bool:
        return self.count is not None or self.memory_bytes is not None or self.model is not None


@dataclass(frozen=True)
class GpuInventory:
    """The devices a start will see and the source they were read from."""

    source: str  # "nvml" | "declared" | "simulated"
    devices: tuple[GpuDevice, ...]
    visible: str | None = None  # the engine's CUDA_VISIBLE_DEVICES, as given
    declared: DeclaredGpus | None = None  # the supervisor's declaration, when NVML measured instead
    memory_known: bool = True  # False for `--gpus N` declared without --gpu-memory-gib

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def model(self) -> str:
        names = sorted({d.model for d in self.devices})
        return " + ".join(names) if names else "none"

    @property
    def uuids(self) -> list[str]:
        return [d.uuid for d in self.devices if d.uuid]

    @property
    def smallest(self) -> GpuDevice | None:
        """The device with the least memory: vLLM sizes every rank's KV cache to the smallest."""
        return min(self.devices, key=lambda d: (d.total_bytes, d.free_bytes or 0), default=None)

    def describe(self) -> str:
        """`2 × NVIDIA H100 80GB HBM3 (79.65 GiB, nvml)`: one phrase for reasons and --explain."""
        small = self.smallest
        memory = (
            f"{small.total_bytes / GIB:.2f} GiB" if small and self.memory_known else "memory not declared"
        )
        return f"{self.count} × {self.model} ({memory}, {self.source})"

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "count": self.count,
            "model": self.model,
            "uuids": self.uuids,
            "devices": [d.to_json() for d in self.devices],
            "visible_devices": self.visible,
        }


def visible_devices(devices: Sequence[GpuDevice], spec: str | None) -> list[GpuDevice]:
    """`devices` as CUDA enumerates them under CUDA_VISIBLE_DEVICES=`spec`: unset means all; entries
    are indices or UUIDs (a unique UUID prefix counts, `GPU-` may be left out); CUDA stops at the
    first entry that names no device (CUDA's documented rule), so `0,9,1` on a two-GPU host sees
    only GPU 0; a device listed twice counts once. Indices are NVML's (PCI bus order), which is
    CUDA's under CUDA_DEVICE_ORDER=PCI_BUS_ID; on a host of identical GPUs the order does not matter."""
    if spec is None:
        return list(devices)
    chosen: list[GpuDevice] = []
    for entry in (e.strip() for e in spec.split(",")):
        match = _device_for(devices, entry)
        if match is None:
            break
        if match not in chosen:
            chosen.append(match)
    return chosen


def _device_for(devices: Sequence[GpuDevice], entry: str) -> GpuDevice | None:
    if not entry:
        return None
    if entry.isdigit():
        return next((d for d in devices if d.index == int(entry)), None)
    wanted = entry if entry.upper().startswith(("GPU-", "MIG-")) else f"GPU-{entry}"
    found = [d for d in devices if d.uuid.lower().startswith(wanted.lower())]
    return found[0] if len(found) == 1 else None


def simulated_device(argv: Sequence[str]) -> GpuInventory | None:
    """The simulator's device when the engine command is `corral sim … --gpu-memory-gib G`: one
    device of G GiB per rank (TP × PP), None when the command is no simulator or declares none."""
    if not _is_simulator(argv):
        return None
    memory = flag_value(argv, "--gpu-memory-gib")
    if memory is None:
        return None
    try:
        gib = float(memory)
    except ValueError:
        raise InventoryError(f"corral sim --gpu-memory-gib {memory!r} is not a number of GiB") from None
    if gib <= 0:
        raise InventoryError(f"corral sim --gpu-memory-gib {memory}: give the device memory in GiB, > 0")
    try:
        size = parallel_size(argv)
        ranks = size.tensor * size.pipeline
    except ValueError:  # the parallel identity check refuses the bad value, naming it
        ranks = 1
    device = [
        GpuDevice(index=i, uuid="", model="simulated", total_bytes=int(gib * GIB)) for i in range(ranks)
    ]
    return GpuInventory(source="simulated", devices=tuple(device))


def _is_simulator(argv: Sequence[str]) -> bool:
    """`corral sim …`, `/path/to/corral sim …` or `python -m corral sim …`."""
    for i in range(1, len(argv)):
        if argv[i] == "sim":
            before = argv[i - 1]
            return os.path.basename(before) == "corral"
    return False


def read_inventory(
    argv: Sequence[str],
    environ: Mapping[str, str],
    declared: DeclaredGpus | None = None,
    nvml: Callable[[], list[GpuDevice] | None] = read_gpus,
) -> GpuInventory | None:
    """The GPUs the engine started from `argv` in `environ` will see (see the module docstring for
    the order), or None when nothing says ("not measured"). `nvml` is the NVML reader, passed in so a
    test can stand in for a host's GPUs."""
    simulated = simulated_device(argv)
    if simulated is not None:
        return simulated
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    measured = nvml()
    if measured is not None:
        devices = visible_devices(measured, visible)
        return GpuInventory(
            "nvml", tuple(devices), visible, declared if declared and declared.given else None
        )
    if declared is None or (declared.count is None and declared.memory_bytes is None):
        return None
    count = declared.count or 1
    model = declared.model or "declared"
    memory = declared.memory_bytes or 0
    devices = [GpuDevice(index=i, uuid="", model=model, total_bytes=memory) for i in range(count)]
    return GpuInventory("declared", tuple(devices), visible, memory_known=declared.memory_bytes is not None)
