"""The simulator's memory arithmetic: a model directory read by sizes, one rank's weights and KV cache on a
simulated GPU, and vLLM's refusals (CUDA OOM while loading, no KV memory, KV too small for one sequence)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.sim.core.config import SimConfig
from corral.sim.core.device import (
    GIB,
    OVERHEAD_BYTES,
    MemoryPlan,
    SimulatedDevice,
    StartupMemoryError,
    format_gib,
    kv_bytes_per_token,
    plan_memory,
)
from corral.sim.core.model_dir import ModelDirError, ModelShape, read_model_dir
from corral.sim.core.sizing import default_max_model_len, size_engine
from tests.support.model_dirs import make_model_dir

LLAMA_8B_KV = 2 * 32 * 8 * 128 * 2  # bytes per token: K and V, 32 layers, 8 KV heads, head_dim 128, bf16


def _plan(
    shape: ModelShape, gib: float | None, tp: int = 1, max_model_len: int = 8192, kv: str = "bfloat16"
) -> MemoryPlan:
    device = SimulatedDevice(int(gib * GIB)) if gib is not None else None
    return plan_memory(
        shape,
        device,
        tensor_parallel_size=tp,
        kv_dtype=kv,
        block_size=16,
        max_model_len=max_model_len,
        kv_cache_blocks=4096,
    )


def test_model_dir_is_read_by_file_sizes(tmp_path: Path) -> None:
    d = make_model_dir(tmp_path / "m", weights_bytes=30 * GIB, shards=4, max_position_embeddings=8192)
    shape = read_model_dir(str(d))
    assert shape.weights_bytes == 30 * GIB
    assert len(shape.shards) == 4
    assert (shape.num_hidden_layers, shape.num_key_value_heads, shape.head_dim) == (32, 8, 128)
    assert shape.max_position_embeddings == 8192
    assert kv_bytes_per_token(shape, 1, "bfloat16") == LLAMA_8B_KV


def test_head_dim_given_wins_over_hidden_size(tmp_path: Path) -> None:
    d = make_model_dir(tmp_path / "m", hidden_size=4096, num_attention_heads=32, head_dim=256)
    assert read_model_dir(str(d)).head_dim == 256


def test_no_kv_heads_field_means_one_per_attention_head(tmp_path: Path) -> None:
    d = make_model_dir(tmp_path / "m", num_attention_heads=16, hidden_size=2048)
    config = json.loads((d / "config.json").read_text())
    del config["num_key_value_heads"]
    (d / "config.json").write_text(json.dumps(config))
    assert read_model_dir(str(d)).num_key_value_heads == 16


def test_a_directory_without_weights_or_config_is_refused_with_the_path(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelDirError, match=r"config\.json does not exist"):
        read_model_dir(str(empty))
    d = make_model_dir(tmp_path / "m")
    for f in d.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelDirError, match=r"no \*\.safetensors"):
        read_model_dir(str(d))
    d2 = make_model_dir(tmp_path / "m2", num_hidden_layers=0)
    with pytest.raises(ModelDirError, match="num_hidden_layers"):
        read_model_dir(str(d2))


def test_fits_leaves_utilization_minus_weights_minus_overhead_for_kv() -> None:
    shape = ModelShape(weights_bytes=30 * GIB)
    plan = _plan(shape, 80)
    available = int(80 * GIB * 0.9) - 30 * GIB - OVERHEAD_BYTES
    assert plan.weights_per_rank == 30 * GIB
    assert plan.available_kv_bytes == available
    assert plan.num_blocks == available // (16 * LLAMA_8B_KV)
    assert plan.kv_cache_tokens == plan.num_blocks * 16
    assert plan.kv_cache_bytes == plan.kv_cache_tokens * LLAMA_8B_KV <= available
    assert plan.max_concurrency == plan.num_blocks / (8192 // 16)


def test_weights_larger_than_the_device_fail_while_loading_with_cuda_oom() -> None:
    shape = ModelShape(weights_bytes=30 * GIB, shards=tuple((f"s{i}", int(7.5 * GIB)) for i in range(4)))
    with pytest.raises(StartupMemoryError) as err:
        _plan(shape, 24)
    assert err.value.during_load
    assert str(err.value).startswith(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB."
    )
    assert "total capacity of 24.00 GiB" in str(err.value)


def test_weights_within_the_device_but_not_its_utilized_share_leave_no_kv_memory() -> None:
    with pytest.raises(StartupMemoryError) as err:
        _plan(ModelShape(weights_bytes=30 * GIB), 32)  # 28.8 GiB usable < 30 GiB + overhead
    assert not err.value.during_load
    assert str(err.value).startswith("ValueError: No available memory for the cache blocks.")
    assert err.value.available_kv_bytes == int(32 * GIB * 0.9) - 31 * GIB < 0


def test_kv_memory_below_one_max_length_sequence_is_refused_with_vllms_estimate() -> None:
    available = int(36 * GIB * 0.9) - 31 * GIB  # 1.4 GiB
    with pytest.raises(StartupMemoryError) as err:
        _plan(ModelShape(weights_bytes=30 * GIB), 36, max_model_len=131072)
    needed = 131072 * LLAMA_8B_KV
    estimated = available // (16 * LLAMA_8B_KV) * 16
    assert str(err.value) == (
        "ValueError: To serve at least one request with the models's max seq len (131072), "
        f"({format_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache memory "
        f"({format_gib(available)} GiB). Based on the available memory, the estimated maximum model length "
        f"is {estimated}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for "
        "more details."
    )
    assert format_gib(needed) == "16.0"


def test_tensor_parallel_halves_weights_and_kv_heads_per_rank() -> None:
    shape = ModelShape(weights_bytes=30 * GIB)
    one, two = _plan(shape, 80, tp=1), _plan(shape, 80, tp=2)
    assert two.weights_per_rank == one.weights_per_rank // 2
    assert two.kv_bytes_per_token == one.kv_bytes_per_token // 2
    with pytest.raises(StartupMemoryError):
        _plan(shape, 24, tp=1)
    assert _plan(shape, 24, tp=2).weights_per_rank == 15 * GIB  # the same model fits two 24 GiB ranks


def test_fp8_kv_cache_holds_twice_the_tokens() -> None:
    shape = ModelShape(weights_bytes=8 * GIB)
    bf16, fp8 = _plan(shape, 80).num_blocks, _plan(shape, 80, kv="fp8_e4m3").num_blocks
    assert fp8 in (2 * bf16, 2 * bf16 + 1)  # floor division of the same memory by half the block size
    assert ModelShape().kv_dtype("auto", "fp8") == "fp8_e4m3"
    assert ModelShape(torch_dtype="float32").kv_dtype("auto", "auto") == "bfloat16"


def test_without_a_device_the_blocks_are_as_given() -> None:
    plan = _plan(ModelShape(weights_bytes=GIB), None)
    assert plan.available_kv_bytes is None
    assert plan.num_blocks == 4096
    assert plan.kv_cache_bytes == 4096 * 16 * 128 * 1024  # the sim's long-standing 128 KiB per token


def test_sizing_a_name_keeps_the_old_figures() -> None:
    sizing = size_engine(SimConfig())
    assert sizing.plan is not None and sizing.config_error is None
    assert sizing.weights_bytes == GIB
    assert sizing.kv_cache_bytes == SimConfig().kv_cache_bytes


def test_sizing_refuses_a_max_model_len_beyond_the_checkpoint(tmp_path: Path) -> None:
    d = make_model_dir(tmp_path / "m", max_position_embeddings=4096)
    assert default_max_model_len(str(d)) == 4096
    assert default_max_model_len("some/hub-name") == 2048
    sizing = size_engine(SimConfig(model=str(d), max_model_len=8192))
    assert sizing.config_error is not None and "User-specified max_model_len (8192)" in sizing.config_error


def test_sizing_refuses_a_fail_rank_that_is_not_a_worker(tmp_path: Path) -> None:
    sizing = size_engine(SimConfig(tensor_parallel_size=2, fail_rank=2))
    assert sizing.config_error is not None and "--fail-rank 2" in sizing.config_error
    assert size_engine(SimConfig(tensor_parallel_size=2, fail_rank=1)).config_error is None


def test_sizing_follows_the_device(tmp_path: Path) -> None:
    d = make_model_dir(tmp_path / "m", weights_bytes=30 * GIB)
    cfg = SimConfig(model=str(d), max_model_len=8192, gpu_memory_gib=80.0, tensor_parallel_size=2)
    sizing = size_engine(cfg)
    assert sizing.plan is not None
    assert sizing.weights_bytes == 15 * GIB
    assert sizing.plan.num_blocks == (int(80 * GIB * 0.9) - 16 * GIB) // (16 * LLAMA_8B_KV // 2)
    failed = size_engine(SimConfig(model=str(d), max_model_len=8192, gpu_memory_gib=24.0))
    assert failed.plan is None and failed.memory_error is not None and failed.memory_error.during_load
