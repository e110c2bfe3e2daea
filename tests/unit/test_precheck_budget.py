"""PRECHECK's memory budget on sparse model directories: weights per rank, vLLM's KV per token, one
`--max-model-len` sequence, the headroom lines, against utilization × the smallest GPU; refusals name
the line and the shortfall."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.engine.model_config import ModelConfigError, kv_dtype_bytes, read_model_config, weight_files
from corral.supervisor.precheck.budget import (
    BudgetOverrides,
    compute_budget,
    memory_budget,
)
from corral.supervisor.precheck.check import Outcome
from corral.supervisor.precheck.engine_args import EngineArgError, max_model_len
from corral.supervisor.precheck.explain import render
from corral.supervisor.precheck.inventory import DeclaredGpus, GpuInventory, read_inventory
from tests.support.model_dirs import GIB, make_model_dir

TWO_GIB = 2 * GIB  # the default headroom of one rank: activations 1.25 + non-torch 0.25 + graphs 0.5


def gpus(memory_gib: float, count: int = 1) -> GpuInventory:
    declared = DeclaredGpus(count=count, memory_bytes=int(memory_gib * GIB))
    inventory = read_inventory([], {}, declared, nvml=lambda: None)
    assert inventory is not None
    return inventory


@pytest.fixture
def llama_30g(tmp_path: Path) -> Path:
    # 32 layers, 8 KV heads of 128: 128 KiB of bf16 KV per token
    return make_model_dir(tmp_path / "m30", weights_bytes=30 * GIB, shards=4, max_position_embeddings=8192)


def test_thirty_gib_of_weights_on_a_24_gib_gpu_is_refused_with_the_arithmetic(llama_30g: Path) -> None:
    result = memory_budget(["vllm", "serve", str(llama_30g)], gpus(24), environ={})
    assert result.outcome is Outcome.REFUSED
    assert result.reason.startswith(
        "weights 30.00 GiB/rank + KV 1 seq 1.00 GiB + headroom 2.00 GiB = 33.00 GiB > 0.90 × 24.00 GiB = "
        "21.60 GiB by 11.40 GiB: the weights alone (30.00 GiB/rank) do not fit"
    )
    assert "--tensor-parallel-size" in result.reason


def test_the_same_directory_fits_an_80_gib_gpu_and_the_evidence_adds_up(llama_30g: Path) -> None:
    result = memory_budget(["vllm", "serve", str(llama_30g)], gpus(80), environ={})
    assert result.outcome is Outcome.PASSED
    ev = result.evidence
    assert ev["weights_bytes_per_rank"] == 30 * GIB
    assert ev["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2
    assert ev["min_kv_tokens"] == 8192
    assert ev["headroom_bytes"] == TWO_GIB
    assert ev["usable_bytes"] == int(0.9 * 80 * GIB)
    assert ev["kv_budget_bytes"] == ev["usable_bytes"] - 30 * GIB - TWO_GIB
    assert (
        ev["expected_kv_tokens"] == ev["kv_budget_bytes"] // (ev["kv_bytes_per_token"] * 16) * 16 == 327_680
    )
    assert any(line.startswith("weights/rank") and "4 *.safetensors" in line for line in ev["lines"])


def test_tensor_parallel_halves_the_weights_and_the_kv_heads_per_rank(llama_30g: Path) -> None:
    one = compute_budget(["vllm", "serve", str(llama_30g)], gpus(24, 2), BudgetOverrides(), {})
    two = compute_budget(["vllm", "serve", str(llama_30g), "-tp", "2"], gpus(24, 2), BudgetOverrides(), {})
    assert two.weights_bytes_per_rank == 15 * GIB == (one.weights_bytes_per_rank or 0) // 2
    assert two.kv_bytes_per_token == (one.kv_bytes_per_token or 0) // 2
    assert two.headroom_bytes == TWO_GIB + GIB // 2  # NCCL once there are two ranks
    result = memory_budget(["vllm", "serve", str(llama_30g), "-tp", "2"], gpus(24, 2), environ={})
    assert result.outcome is Outcome.PASSED, result.reason


def test_pipeline_parallel_splits_the_layers_and_rounds_up_to_the_largest_stage(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m", num_hidden_layers=30)
    budget = compute_budget(["vllm", "serve", str(model), "-pp", "4"], gpus(80, 4), BudgetOverrides(), {})
    assert budget.kv_bytes_per_token == 2 * 8 * 8 * 128 * 2  # ceil(30 / 4) = 8 layers on the largest stage


def test_kv_per_token_of_a_gqa_config_uses_head_dim_when_given(tmp_path: Path) -> None:
    # Gemma-like: head_dim 256 differs from hidden 3072 ÷ 16 heads = 192
    given = read_model_config(
        make_model_dir(
            tmp_path / "g",
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=4,
            hidden_size=3072,
            head_dim=256,
        )
    )
    derived = read_model_config(
        make_model_dir(
            tmp_path / "d",
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=4,
            hidden_size=3072,
        )
    )
    assert given.kv_bytes_per_token(2) == 2 * 28 * 4 * 256 * 2
    assert derived.kv_bytes_per_token(2) == 2 * 28 * 4 * 192 * 2
    assert "3072 hidden ÷ 16 heads" in derived.kv_formula(2)
    # more TP ranks than KV heads: vLLM replicates, one head per rank
    assert given.kv_bytes_per_token(2, tensor_parallel=8) == 2 * 28 * 1 * 256 * 2


def test_an_fp8_kv_cache_halves_the_kv_per_token(llama_30g: Path) -> None:
    argv = ["vllm", "serve", str(llama_30g)]
    auto = compute_budget(argv, gpus(80), BudgetOverrides(), {})
    fp8 = compute_budget([*argv, "--kv-cache-dtype", "fp8"], gpus(80), BudgetOverrides(), {})
    assert fp8.kv_bytes_per_token == (auto.kv_bytes_per_token or 0) // 2
    assert kv_dtype_bytes("auto", "float32") == 4 and kv_dtype_bytes(None, "bfloat16") == 2
    with pytest.raises(ModelConfigError, match="unknown dtype 'int3'"):
        kv_dtype_bytes("int3", "bfloat16")


def test_a_context_too_long_for_the_kv_left_is_refused_naming_the_longest_that_fits(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "long", weights_bytes=15 * GIB, max_position_embeddings=131072)
    result = memory_budget(["vllm", "serve", str(model)], gpus(24), environ={})
    assert result.refused
    assert "KV 1 seq 16.00 GiB" in result.reason
    assert "KV for one 131,072-token sequence needs 16.00 GiB, 4.60 GiB is left" in result.reason
    assert "the longest context that fits is 37,680 tokens" in result.reason
    shorter = memory_budget(["vllm", "serve", str(model), "--max-model-len", "32k"], gpus(24), environ={})
    assert shorter.outcome is Outcome.PASSED and shorter.evidence["min_kv_tokens"] == 32_000


def test_weights_and_headroom_that_leave_no_kv_memory_are_refused(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m", weights_bytes=20 * GIB)
    result = memory_budget(["vllm", "serve", str(model)], gpus(24), environ={})
    assert result.refused and "no memory left for the KV cache" in result.reason


def test_without_an_inventory_the_budget_is_not_measured_but_its_lines_are_shown(llama_30g: Path) -> None:
    result = memory_budget(["vllm", "serve", str(llama_30g)], None, environ={})
    assert result.outcome is Outcome.NOT_MEASURED and "GPU memory" in result.reason
    assert result.evidence["weights_bytes_per_rank"] == 30 * GIB
    assert result.evidence["usable_bytes"] is None and result.evidence["expected_kv_tokens"] is None
    assert any(line.startswith("usable/rank") and "not measured" in line for line in result.evidence["lines"])


def test_a_hub_id_needs_declared_weights_or_a_cached_snapshot(tmp_path: Path) -> None:
    argv = ["vllm", "serve", "org/model", "--revision", "abc123"]
    unknown = memory_budget(argv, gpus(24), environ={"HF_HOME": str(tmp_path / "empty")})
    assert unknown.outcome is Outcome.NOT_MEASURED and "weights" in unknown.reason
    declared = memory_budget(
        argv, gpus(24), BudgetOverrides(weights_bytes=30 * GIB), {"HF_HOME": str(tmp_path)}
    )
    assert declared.refused and "the weights alone (30.00 GiB/rank)" in declared.reason
    # the snapshot in the Hugging Face cache is read like a directory
    repo = tmp_path / "hf" / "hub" / "models--org--model"
    make_model_dir(repo / "snapshots" / "abc123", weights_bytes=4 * GIB)
    cached = memory_budget(argv, gpus(24), environ={"HF_HOME": str(tmp_path / "hf")})
    assert cached.outcome is Outcome.PASSED and cached.evidence["weights_bytes_per_rank"] == 4 * GIB


def test_the_headroom_is_overridable_and_graphs_go_with_enforce_eager(llama_30g: Path) -> None:
    argv = ["vllm", "serve", str(llama_30g)]
    assert compute_budget([*argv, "--enforce-eager"], gpus(80), BudgetOverrides(), {}).headroom_bytes == int(
        1.5 * GIB
    )
    declared = compute_budget(argv, gpus(80), BudgetOverrides(headroom_bytes=5 * GIB), {})
    assert declared.headroom_bytes == 5 * GIB
    assert [line.split()[0] for line in declared.to_evidence()["lines"]].count("headroom") == 1


def test_free_memory_below_the_share_asked_for_is_refused_as_vllm_refuses_it(llama_30g: Path) -> None:
    from corral.engine.gpus import GpuDevice

    busy = GpuDevice(index=0, uuid="GPU-x", model="H100", total_bytes=80 * GIB, free_bytes=40 * GIB)
    inventory = read_inventory([], {}, nvml=lambda: [busy])
    result = memory_budget(["vllm", "serve", str(llama_30g)], inventory, environ={})
    assert result.refused and "free memory on the device (40.00 GiB)" in result.reason


@pytest.mark.parametrize(
    ("flag", "value", "text"),
    [
        ("--gpu-memory-utilization", "0", "not a fraction in (0, 1]"),
        ("--gpu-memory-utilization", "1.5", "not a fraction in (0, 1]"),
        ("--gpu-memory-utilization", "most", "'most' is not a fraction"),
        ("--max-model-len", "long", "--max-model-len 'long' is not a token count"),
        ("--tensor-parallel-size", "x", "--tensor-parallel-size 'x' is not a positive integer"),
        ("--kv-cache-dtype", "int4", "unknown dtype 'int4'"),
    ],
)
def test_bad_engine_values_are_refused_with_the_flag_and_what_to_do(
    llama_30g: Path, flag: str, value: str, text: str
) -> None:
    result = memory_budget(["vllm", "serve", str(llama_30g), flag, value], gpus(80), environ={})
    assert result.refused and text in result.reason


def test_a_context_past_the_models_own_is_refused_as_vllm_refuses_it(llama_30g: Path) -> None:
    argv = ["vllm", "serve", str(llama_30g), "--max-model-len", "16384"]
    result = memory_budget(argv, gpus(80), environ={})
    assert result.refused and "greater than the model's context (8192" in result.reason
    allowed = memory_budget(argv, gpus(80), environ={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert allowed.outcome is Outcome.PASSED and allowed.evidence["min_kv_tokens"] == 16384


def test_bad_overrides_and_model_directories_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--headroom-gib"):
        BudgetOverrides(headroom_bytes=-1)
    with pytest.raises(ModelConfigError, match=r"has no config\.json"):
        read_model_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": "many"}))
    with pytest.raises(ModelConfigError, match="num_hidden_layers is 'many'"):
        read_model_config(tmp_path)
    result = memory_budget(["vllm", "serve", str(tmp_path)], gpus(80), environ={})
    assert result.refused and "num_hidden_layers" in result.reason


def test_max_model_len_reads_vllm_suffixes() -> None:
    assert max_model_len("8192") == 8192
    assert max_model_len("32k") == 32_000 and max_model_len("32K") == 32_768
    assert max_model_len("1m") == 1_000_000 and max_model_len("25.6k") == 25_600
    assert max_model_len("-1") is None and max_model_len("auto") is None
    with pytest.raises(EngineArgError):
        max_model_len("0")


def test_model_config_reads_what_vllm_reads(tmp_path: Path) -> None:
    # a multimodal checkpoint keeps the language model under text_config
    nested = make_model_dir(
        tmp_path / "vl", extra_config={"text_config": {"num_hidden_layers": 40, "num_key_value_heads": 2}}
    )
    assert read_model_config(nested).num_hidden_layers == 40 and read_model_config(nested).num_kv_heads == 2
    # yarn scaling stretches the context; llama3 scaling is already in max_position_embeddings
    yarn = make_model_dir(
        tmp_path / "yarn",
        max_position_embeddings=32768,
        extra_config={
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
        },
    )
    assert read_model_config(yarn).max_position_embeddings == 131072
    llama3 = make_model_dir(
        tmp_path / "l3",
        max_position_embeddings=131072,
        extra_config={"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
    )
    assert read_model_config(llama3).max_position_embeddings == 131072
    # latent attention (DeepSeek): one latent vector per layer, the same on every TP rank
    mla = read_model_config(
        make_model_dir(
            tmp_path / "mla", num_hidden_layers=61, extra_config={"kv_lora_rank": 512, "qk_rope_head_dim": 64}
        )
    )
    assert mla.kv_bytes_per_token(2) == mla.kv_bytes_per_token(2, tensor_parallel=8) == 61 * 576 * 2


def test_weight_files_follow_the_safetensors_index(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m", weights_bytes=2 * GIB, shards=2)
    names = sorted(p.name for p in model.glob("*.safetensors"))
    # a consolidated copy beside the shards (Mistral's layout): vLLM loads the indexed shards only
    make_model_dir(tmp_path / "c", weights_bytes=2 * GIB).joinpath("model.safetensors").rename(
        model / "consolidated.safetensors"
    )
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": names[0], "b": names[1]}})
    )
    files = weight_files(model)
    assert files is not None and files.total_bytes == 2 * GIB and files.files == tuple(names)


def test_explain_prints_the_budget_lines_under_the_check(llama_30g: Path) -> None:
    result = memory_budget(["vllm", "serve", str(llama_30g)], gpus(24), environ={})
    text = render([result])
    lines = text.splitlines()
    assert lines[0].startswith("  memory_budget  refused       weights 30.00 GiB/rank")
    assert "      weights/rank         30.00 GiB  = 30.00 GiB in 4 *.safetensors" in lines
    assert any("usable/rank" in line and "--gpu-memory-utilization 0.9 × 24.00 GiB" in line for line in lines)
    assert lines[-1] == "  start refused by memory_budget"
