"""PRECHECK's parallel identity and the GPU inventory it reads: ranks against visible GPUs,
CUDA_VISIBLE_DEVICES as CUDA applies it, the simulator's device, declared GPUs as the fallback and as
an expectation NVML must meet."""

from __future__ import annotations

import pytest

from corral.engine.gpus import GpuDevice
from corral.supervisor.precheck.check import Outcome
from corral.supervisor.precheck.explain import render
from corral.supervisor.precheck.inventory import (
    DeclaredGpus,
    InventoryError,
    read_inventory,
    visible_devices,
)
from corral.supervisor.precheck.parallel import parallel_identity, parallel_layout

GIB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"


def host(n: int, model: str = H100, total: int = 80 * GIB) -> list[GpuDevice]:
    return [
        GpuDevice(
            index=i, uuid=f"GPU-{i}a{i}b-0000-1111", model=model, total_bytes=total, free_bytes=total - GIB
        )
        for i in range(n)
    ]


def on(devices: list[GpuDevice] | None):  # an NVML reader standing in for a host's GPUs
    return lambda: devices


def test_world_size_beyond_the_visible_gpus_is_refused_naming_both_numbers() -> None:
    argv = ["vllm", "serve", "org/m", "-tp", "4"]
    inventory = read_inventory(argv, {}, nvml=on(host(2)))
    result = parallel_identity(argv, inventory)
    assert result.outcome is Outcome.REFUSED
    assert "TP 4 × PP 1 × DP 1 = 4 ranks need 4 GPUs, the engine sees 2" in result.reason
    assert "--tensor-parallel-size" in result.reason
    assert result.evidence["world_size"] == 4


def test_ranks_that_fit_pass_and_the_evidence_pins_the_gpus() -> None:
    argv = ["vllm", "serve", "org/m", "--tensor-parallel-size=2", "--pipeline-parallel-size", "2"]
    result = parallel_identity(argv, read_inventory(argv, {}, nvml=on(host(4))))
    assert result.outcome is Outcome.PASSED
    ev = result.evidence
    assert (ev["tensor_parallel_size"], ev["pipeline_parallel_size"], ev["world_size"]) == (2, 2, 4)
    assert ev["gpus"]["source"] == "nvml"
    assert ev["gpus"]["count"] == 4 and ev["gpus"]["model"] == H100
    assert ev["gpus"]["uuids"] == [f"GPU-{i}a{i}b-0000-1111" for i in range(4)]


def test_data_parallel_ranks_on_this_host_count() -> None:
    assert parallel_layout(["-tp", "2", "-dp", "4"]).world_size == 8
    assert parallel_layout(["-tp", "2", "-dp", "4", "--data-parallel-size-local", "2"]).world_size == 4
    argv = ["vllm", "serve", "m", "-tp", "2", "-dp", "2"]
    assert parallel_identity(argv, read_inventory(argv, {}, nvml=on(host(2)))).refused


def test_without_any_inventory_nothing_is_measured_yet_the_layout_is_evidence() -> None:
    argv = ["vllm", "serve", "org/m", "-tp", "2"]
    assert read_inventory(argv, {}, nvml=on(None)) is None
    result = parallel_identity(argv, None)
    assert result.outcome is Outcome.NOT_MEASURED
    assert result.evidence["world_size"] == 2 and result.evidence["gpus"] is None


def test_cuda_visible_devices_filters_by_index_and_uuid_as_cuda_does() -> None:
    devices = host(4)
    assert [d.index for d in visible_devices(devices, None)] == [0, 1, 2, 3]
    assert [d.index for d in visible_devices(devices, "3,1")] == [3, 1]
    assert [d.index for d in visible_devices(devices, "GPU-2a2b,0")] == [2, 0]  # a unique UUID prefix
    assert [d.index for d in visible_devices(devices, "1a1b")] == [1]  # "GPU-" may be left out
    assert [d.index for d in visible_devices(devices, "0,9,1")] == [0]  # CUDA stops at an invalid entry
    assert visible_devices(devices, "") == []
    assert visible_devices(devices, "-1") == []


def test_the_engine_environment_decides_what_the_check_sees() -> None:
    argv = ["vllm", "serve", "org/m", "-tp", "2"]
    one = read_inventory(argv, {"CUDA_VISIBLE_DEVICES": "2"}, nvml=on(host(4)))
    assert one is not None and one.count == 1
    result = parallel_identity(argv, one)
    assert result.refused and "CUDA_VISIBLE_DEVICES=2" in result.reason
    two = read_inventory(argv, {"CUDA_VISIBLE_DEVICES": "2,3"}, nvml=on(host(4)))
    assert parallel_identity(argv, two).outcome is Outcome.PASSED


def test_declared_gpus_are_the_inventory_where_nvml_is_absent() -> None:
    argv = ["vllm", "serve", "org/m", "-tp", "2"]
    declared = DeclaredGpus(count=2, memory_bytes=24 * GIB, model="L4")
    inventory = read_inventory(argv, {}, declared, nvml=on(None))
    assert inventory is not None and inventory.source == "declared"
    assert [d.total_bytes for d in inventory.devices] == [24 * GIB, 24 * GIB]
    assert parallel_identity(argv, inventory).outcome is Outcome.PASSED
    assert parallel_identity(["vllm", "serve", "m", "-tp", "4"], inventory).refused


def test_on_a_gpu_host_the_declaration_is_an_expectation_nvml_must_meet() -> None:
    argv = ["vllm", "serve", "org/m"]
    measured = on(host(1, model="NVIDIA A10G", total=22 * GIB))
    other_model = read_inventory(argv, {}, DeclaredGpus(model="H100"), nvml=measured)
    result = parallel_identity(argv, other_model)
    assert result.refused and "'H100' declared, GPU 0 is 'NVIDIA A10G'" in result.reason
    smaller = read_inventory(argv, {}, DeclaredGpus(memory_bytes=80 * GIB), nvml=measured)
    assert parallel_identity(argv, smaller).refused
    # "80" GiB for an H100 80GB: NVML reads 79.65 GiB, the same device
    h100 = on(host(1, total=int(79.65 * GIB)))
    same = read_inventory(argv, {}, DeclaredGpus(count=1, memory_bytes=80 * GIB, model="h100"), nvml=h100)
    assert parallel_identity(argv, same).outcome is Outcome.PASSED
    fewer = read_inventory(argv, {}, DeclaredGpus(count=2), nvml=h100)
    assert parallel_identity(argv, fewer).refused


def test_a_simulator_engine_uses_its_own_device_even_on_a_gpu_host() -> None:
    argv = ["corral", "sim", "--model", "m", "--gpu-memory-gib", "24", "-tp", "2"]
    inventory = read_inventory(argv, {}, DeclaredGpus(memory_bytes=80 * GIB), nvml=on(host(8)))
    assert inventory is not None and inventory.source == "simulated"
    assert inventory.count == 2 and {d.total_bytes for d in inventory.devices} == {24 * GIB}
    # a simulator without a declared device falls back like any engine
    plain = read_inventory(["/venv/bin/corral", "sim", "--model", "m"], {}, nvml=on(host(1)))
    assert plain is not None and plain.source == "nvml"


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["vllm", "serve", "m", "-tp", "two"], "--tensor-parallel-size 'two'"),
        (["vllm", "serve", "m", "--pipeline-parallel-size", "0"], "--pipeline-parallel-size '0'"),
        (["vllm", "serve", "m", "-dp", "-1"], "positive integer"),
    ],
)
def test_bad_parallel_sizes_are_refused_with_the_flag_and_value(argv: list[str], text: str) -> None:
    result = parallel_identity(argv, None)
    assert result.refused and text in result.reason and "fix the engine command" in result.reason


def test_bad_declarations_are_errors_naming_the_flag() -> None:
    with pytest.raises(InventoryError, match="--gpus 0"):
        DeclaredGpus(count=0)
    with pytest.raises(InventoryError, match="--gpu-memory-gib"):
        DeclaredGpus(memory_bytes=0)
    with pytest.raises(InventoryError, match="not a number"):
        read_inventory(["corral", "sim", "--gpu-memory-gib", "lots"], {}, nvml=on(None))


def test_explain_shows_each_step_aligned_and_the_verdict() -> None:
    argv = ["vllm", "serve", "org/m", "-tp", "2"]
    result = parallel_identity(argv, read_inventory(argv, {}, nvml=on(host(2))))
    text = render([result])
    assert text.splitlines()[0].startswith("  parallel_identity  passed")
    assert "      ranks                       2  = 2 × 1 × 1" in text
    assert "GPU 1" in text and "GPU-1a1b-0000-1111" in text
    assert text.rstrip().endswith("start authorized")
    refused = parallel_identity(
        ["vllm", "serve", "m", "-tp", "8"], read_inventory(argv, {}, nvml=on(host(2)))
    )
    assert render([result, refused]).rstrip().endswith("start refused by parallel_identity")
