"""PRECHECK's parallel identity: the ranks the engine command asks for (TP × PP × the data-parallel
ranks on this host) against the GPUs the engine will see, and those GPUs (count, model, UUIDs) as
evidence the bundle fingerprint records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.engine.flags import flag_value
from corral.supervisor.precheck.check import CheckResult, Outcome
from corral.supervisor.precheck.engine_args import EngineArgError, positive_int_flag
from corral.supervisor.precheck.explain import Step, gib, step_lines
from corral.supervisor.precheck.inventory import GpuInventory

NAME = "parallel_identity"
# a measured device this much below the declared --gpu-memory-gib is another device: "80" GiB for an
# H100 80GB reads 79.65 GiB through NVML
DECLARED_MEMORY_TOLERANCE = 0.03


@dataclass(frozen=True)
class ParallelLayout:
    """The engine's ranks: tensor × pipeline parallel per replica, data-parallel replicas on this host."""

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    data_local: int | None = None  # --data-parallel-size-local; None: every DP rank runs here

    @property
    def local_data(self) -> int:
        return self.data if self.data_local is None else self.data_local

    @property
    def world_size(self) -> int:
        """GPUs this host's engine process uses: TP × PP × local DP ranks."""
        return self.tensor * self.pipeline * self.local_data

    def describe(self) -> str:
        local = f" (local {self.data_local})" if self.data_local is not None else ""
        ranks = f"{self.world_size} rank" + ("s" if self.world_size > 1 else "")
        return f"TP {self.tensor} × PP {self.pipeline} × DP {self.data}{local} = {ranks}"

    def to_json(self) -> dict[str, Any]:
        return {
            "tensor_parallel_size": self.tensor,
            "pipeline_parallel_size": self.pipeline,
            "data_parallel_size": self.data,
            "data_parallel_size_local": self.local_data,
            "world_size": self.world_size,
        }


def parallel_layout(argv: Sequence[str]) -> ParallelLayout:
    """The layout `argv` asks vLLM for (defaults 1); EngineArgError for a value vLLM would refuse."""
    data_local = flag_value(argv, "--data-parallel-size-local", "-dpl")
    return ParallelLayout(
        tensor=positive_int_flag(argv, "--tensor-parallel-size", "-tp"),
        pipeline=positive_int_flag(argv, "--pipeline-parallel-size", "-pp"),
        data=positive_int_flag(argv, "--data-parallel-size", "-dp"),
        data_local=None
        if data_local is None
        else positive_int_flag(argv, "--data-parallel-size-local", "-dpl"),
    )


def _steps(argv: Sequence[str], layout: ParallelLayout, inventory: GpuInventory | None) -> list[Step]:
    def source(*names: str) -> str:
        return names[0] if flag_value(argv, *names) is not None else f"default ({names[0]} not given)"

    steps = [
        Step("tensor parallel", str(layout.tensor), source("--tensor-parallel-size", "-tp")),
        Step("pipeline parallel", str(layout.pipeline), source("--pipeline-parallel-size", "-pp")),
        Step(
            "data parallel here",
            str(layout.local_data),
            "--data-parallel-size-local"
            if layout.data_local is not None
            else source("--data-parallel-size", "-dp"),
        ),
        Step("ranks", str(layout.world_size), f"{layout.tensor} × {layout.pipeline} × {layout.local_data}"),
    ]
    if inventory is not None:
        where = {"nvml": "NVML", "declared": "--gpus/--gpu-memory-gib", "simulated": "corral sim"}
        visible = f", CUDA_VISIBLE_DEVICES={inventory.visible}" if inventory.visible is not None else ""
        steps.append(
            Step(
                "GPUs visible",
                str(inventory.count),
                f"{where.get(inventory.source, inventory.source)}{visible}",
            )
        )
        for device in inventory.devices[: layout.world_size]:
            free = f", {gib(device.free_bytes)} free" if device.free_bytes is not None else ""
            memory = gib(device.total_bytes) if inventory.memory_known else "?"
            steps.append(
                Step(f"GPU {device.index}", memory, f"{device.model}, {device.uuid or 'no UUID'}{free}")
            )
    return steps


def _declared_mismatch(inventory: GpuInventory, layout: ParallelLayout) -> str | None:
    """Where NVML measured and the supervisor declared, what measured differs from the declaration."""
    declared = inventory.declared
    if declared is None:
        return None
    used = inventory.devices[: layout.world_size]
    if declared.count is not None and inventory.count < declared.count:
        return f"--gpus {declared.count} declared, NVML sees {inventory.count} ({inventory.describe()})"
    if declared.model is not None:
        other = [d for d in used if declared.model.lower() not in d.model.lower()]
        if other:
            return f"--gpu-model {declared.model!r} declared, GPU {other[0].index} is {other[0].model!r}"
    if declared.memory_bytes is not None:
        floor = declared.memory_bytes * (1 - DECLARED_MEMORY_TOLERANCE)
        small = [d for d in used if d.total_bytes < floor]
        if small:
            return (
                f"--gpu-memory-gib {declared.memory_bytes / (1 << 30):g} declared, GPU {small[0].index} has "
                f"{gib(small[0].total_bytes)}"
            )
    return None


def parallel_identity(argv: Sequence[str], inventory: GpuInventory | None) -> CheckResult:
    """The ranks `argv` asks for against `inventory`: refused when they exceed the visible GPUs or
    the GPUs are not the declared ones, not_measured without an inventory, else passed. Evidence:
    the layout (tensor/pipeline/data parallel sizes, world_size), `gpus` (source, count, model,
    UUIDs, devices) and `lines`."""
    try:
        layout = parallel_layout(argv)
    except EngineArgError as exc:
        return CheckResult(NAME, Outcome.REFUSED, f"{exc}; fix the engine command")
    evidence: dict[str, Any] = {
        **layout.to_json(),
        "gpus": inventory.to_json() if inventory is not None else None,
        "lines": step_lines(_steps(argv, layout, inventory)),
    }
    if inventory is None:
        return CheckResult(
            NAME,
            Outcome.NOT_MEASURED,
            f"{layout.describe()}, GPUs not measured: no NVML here and no --gpus/--gpu-memory-gib declared",
            evidence,
        )
    visible = f" (CUDA_VISIBLE_DEVICES={inventory.visible})" if inventory.visible is not None else ""
    if layout.world_size > inventory.count:
        return CheckResult(
            NAME,
            Outcome.REFUSED,
            f"{layout.describe()} need {layout.world_size} GPUs, the engine sees {inventory.count}{visible}: "
            f"lower --tensor-parallel-size/--pipeline-parallel-size/--data-parallel-size or make "
            f"{layout.world_size} GPUs visible",
            evidence,
        )
    mismatch = _declared_mismatch(inventory, layout)
    if mismatch is not None:
        return CheckResult(
            NAME,
            Outcome.REFUSED,
            f"not the GPUs this engine was sized for: {mismatch}; schedule it onto the declared GPUs or "
            "correct the declaration",
            evidence,
        )
    return CheckResult(
        NAME,
        Outcome.PASSED,
        f"{layout.describe()} on {layout.world_size} of {inventory.describe()}{visible}",
        evidence,
    )
