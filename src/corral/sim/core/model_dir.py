"""What the simulator knows of the model it serves: the shape that sizes its KV cache and the bytes of its
weights, read from a local checkpoint directory (`config.json`, `*.safetensors` sizes, never their
contents) or, for a plain model name, a default shape (Llama-3-8B's: 128 KiB of bf16 KV per token).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30

# Bytes per element of the dtypes a config.json or `--dtype` / `--kv-cache-dtype` names. The simulator's
# own copy on purpose, beside its own copy of vLLM's memory arithmetic (sim/core/device.py): a shared
# table would hide a shared mistake from the test that sets the two estimates against each other
# (ARCHITECTURE.md §3, "Two estimates, on purpose"). PRECHECK's table (corral.engine.model_config) may
# know more dtypes, never fewer or other sizes: tests/unit/test_sim_memory_budget.py holds that.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


class ModelDirError(ValueError):
    """The model directory cannot be used; the message says which file or field and what to do."""


@dataclass(frozen=True)
class ModelShape:
    """The fields of a checkpoint that size weights and KV cache."""

    num_hidden_layers: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    torch_dtype: str = "bfloat16"
    max_position_embeddings: int | None = None
    weights_bytes: int = GIB
    shards: tuple[tuple[str, int], ...] = ()  # (file name, bytes) of each safetensors file, sorted

    def model_dtype(self, dtype: str) -> str:
        """vLLM's `--dtype`: `auto` takes the checkpoint's, downcasting float32 to bfloat16."""
        if dtype != "auto":
            return {"half": "float16", "float": "float32"}.get(dtype, dtype)
        return "bfloat16" if self.torch_dtype == "float32" else self.torch_dtype

    def kv_dtype(self, dtype: str, kv_cache_dtype: str) -> str:
        """vLLM's `--kv-cache-dtype`: `auto` is the model dtype; `fp8` is fp8_e4m3."""
        if kv_cache_dtype == "auto":
            return self.model_dtype(dtype)
        return "fp8_e4m3" if kv_cache_dtype == "fp8" else kv_cache_dtype


def is_model_dir(model: str) -> bool:
    return os.path.isdir(model)


def _int_field(config: dict[str, object], name: str, path: Path) -> int:
    value = config.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelDirError(
            f"{path}: field {name!r} is {value!r}; a positive integer is needed to size the KV cache. "
            "Fix config.json or pass a model name instead of a directory."
        )
    return value


def read_model_dir(model: str) -> ModelShape:
    """The shape and weight bytes of a checkpoint directory; `ModelDirError` says what is wrong."""
    root = Path(model)
    config_path = root / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError as exc:
        raise ModelDirError(
            f"{config_path} does not exist: --model {model} is a directory but not a checkpoint "
            "(config.json and *.safetensors expected)."
        ) from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelDirError(f"{config_path} cannot be read as JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelDirError(f"{config_path} holds {type(config).__name__}, not a JSON object.")
    layers = _int_field(config, "num_hidden_layers", config_path)
    heads = _int_field(config, "num_attention_heads", config_path)
    kv_heads = (
        _int_field(config, "num_key_value_heads", config_path) if "num_key_value_heads" in config else heads
    )
    if "head_dim" in config and config["head_dim"] is not None:
        head_dim = _int_field(config, "head_dim", config_path)
    else:
        head_dim = _int_field(config, "hidden_size", config_path) // heads
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ModelDirError(f"{config_path}: torch_dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}.")
    max_pos = config.get("max_position_embeddings")
    shards = tuple(sorted((p.name, p.stat().st_size) for p in root.glob("*.safetensors")))
    if not shards:
        raise ModelDirError(
            f"{root} has no *.safetensors file: the weights are missing (download them, or point --model "
            "at the directory that holds them)."
        )
    return ModelShape(
        num_hidden_layers=layers,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        torch_dtype=dtype,
        max_position_embeddings=max_pos if isinstance(max_pos, int) and max_pos > 0 else None,
        weights_bytes=sum(size for _, size in shards),
        shards=shards,
    )
