"""What a model directory says about memory, read the way vLLM reads it: the attention shape in
`config.json` (layers, KV heads, head dim, dtype, longest context) and the size of the weight files.
The KV-per-token formula and the dtype sizes are vLLM's facts, shared by PRECHECK and the simulator."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# bytes per element of the dtypes vLLM accepts for weights (`--dtype`) and the KV cache
# (`--kv-cache-dtype`: auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_ds_mla). The simulator keeps
# its own copy on purpose (sim/core/model_dir.py); this one is a superset of it, with the same sizes.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
}
# vLLM's default KV block on CUDA: the KV cache is allocated in whole blocks of this many tokens.
KV_BLOCK_TOKENS = 16
# The keys vLLM reads, in this order, for a model's longest context when --max-model-len is not given.
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# rope_scaling types whose factor vLLM does not apply to the derived context (it is already in the config)
_UNSCALED_ROPE = {"su", "longrope", "llama3", "default", "mrope"}


class ModelConfigError(ValueError):
    """A model directory whose config.json cannot be used for the memory arithmetic."""


@dataclass(frozen=True)
class ModelConfig:
    """The attention shape of one model: what the KV cache per token is computed from."""

    num_hidden_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # config.json torch_dtype (or dtype), e.g. bfloat16
    max_position_embeddings: int | None  # the longest context, rope scaling applied; None if unstated
    mla_kv_dim: int | None = None  # DeepSeek-style latent attention: kv_lora_rank + qk_rope_head_dim
    head_dim_source: str = "head_dim"  # "head_dim", or "hidden_size ÷ num_attention_heads"

    def kv_bytes_per_token(
        self, kv_dtype_bytes: int, tensor_parallel: int = 1, pipeline_parallel: int = 1
    ) -> int:
        """KV cache bytes one token takes on one rank: 2 (K and V) × layers on the largest pipeline
        stage × KV heads per tensor-parallel rank (never below one: vLLM replicates heads when
        TP > KV heads) × head dim × dtype bytes. Latent attention (MLA) stores one latent vector per
        layer, the same on every TP rank."""
        layers = math.ceil(self.num_hidden_layers / pipeline_parallel)
        if self.mla_kv_dim is not None:
            return layers * self.mla_kv_dim * kv_dtype_bytes
        heads = max(1, self.num_kv_heads // tensor_parallel)
        return 2 * layers * heads * self.head_dim * kv_dtype_bytes

    def kv_formula(self, kv_dtype_bytes: int, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> str:
        """`kv_bytes_per_token`'s arithmetic as text, for `--explain`."""
        stage = f"{self.num_hidden_layers} layers" + (
            f" ÷ PP {pipeline_parallel}" if pipeline_parallel > 1 else ""
        )
        if self.mla_kv_dim is not None:
            return f"{stage} × MLA latent {self.mla_kv_dim} × {kv_dtype_bytes} B"
        heads = f"{self.num_kv_heads} KV heads" + (f" ÷ TP {tensor_parallel}" if tensor_parallel > 1 else "")
        dim = f"head dim {self.head_dim}" + (
            "" if self.head_dim_source == "head_dim" else f" ({self.head_dim_source})"
        )
        return f"2 (K, V) × {stage} × {heads} × {dim} × {kv_dtype_bytes} B"


def _positive_int(config: Mapping[str, Any], key: str, where: Path) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelConfigError(f"{where}: {key} is {value!r}, not a positive integer")
    return value


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal checkpoints (Llava, Gemma 3, Llama 4, …) keep the language model's shape under
    text_config; its keys win, the top level fills what it leaves out."""
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def _max_context(config: Mapping[str, Any]) -> int | None:
    for key in _CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            break
    else:
        return None
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type", scaling.get("type"))
        factor = scaling.get("factor")
        if kind not in _UNSCALED_ROPE and isinstance(factor, int | float) and factor > 1:
            if kind == "yarn" and "original_max_position_embeddings" in scaling:
                value = int(scaling["original_max_position_embeddings"])
            value = int(value * factor)
    return value


def read_model_config(model_dir: Path) -> ModelConfig:
    """The attention shape in `model_dir/config.json`; ModelConfigError names the file and the key
    that is missing or wrong."""
    path = model_dir / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelConfigError(f"{model_dir} has no config.json: is it a model directory?") from None
    except (OSError, ValueError) as exc:
        raise ModelConfigError(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{path} is not a JSON object")
    config = _text_config(raw)
    layers = _positive_int(config, "num_hidden_layers", path)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    context = _max_context(config)
    if isinstance(config.get("kv_lora_rank"), int):
        latent = _positive_int(config, "kv_lora_rank", path) + int(config.get("qk_rope_head_dim") or 0)
        return ModelConfig(layers, 1, latent, dtype, context, mla_kv_dim=latent)
    heads = _positive_int(config, "num_attention_heads", path)
    kv_heads = (
        _positive_int(config, "num_key_value_heads", path) if "num_key_value_heads" in config else heads
    )
    if config.get("head_dim") is not None:
        return ModelConfig(layers, kv_heads, _positive_int(config, "head_dim", path), dtype, context)
    hidden = _positive_int(config, "hidden_size", path)
    return ModelConfig(
        layers, kv_heads, hidden // heads, dtype, context, head_dim_source=f"{hidden} hidden ÷ {heads} heads"
    )


@dataclass(frozen=True)
class WeightFiles:
    """The checkpoint files vLLM would load from a directory and their total size on disk."""

    total_bytes: int
    files: tuple[str, ...]
    pattern: str  # "*.safetensors", "model.safetensors.index.json", "*.bin"


def weight_files(model_dir: Path) -> WeightFiles | None:
    """The weights in `model_dir`: the shards a safetensors index names (a directory may also hold a
    consolidated copy vLLM does not load), else every `*.safetensors`, else every `*.bin`; None when
    there are none. Sizes follow symlinks (a Hugging Face cache snapshot links to its blobs)."""
    index = model_dir / "model.safetensors.index.json"
    names: list[str] = []
    pattern = "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            names = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
        except (OSError, ValueError):
            names = []
    if not names:
        for pattern in ("*.safetensors", "*.bin"):
            names = sorted(p.name for p in model_dir.glob(pattern) if p.is_file())
            if names:
                break
    if not names:
        return None
    total = 0
    for name in names:
        try:
            total += os.stat(model_dir / name).st_size
        except OSError as exc:
            raise ModelConfigError(
                f"{model_dir / name}: {exc.strerror or exc} (named by {pattern})"
            ) from None
    return WeightFiles(total_bytes=total, files=tuple(names), pattern=pattern)


def served_dtype(dtype_flag: str | None, config_dtype: str) -> str:
    """The dtype vLLM computes in: `--dtype` when given, else the checkpoint's, float32 checkpoints
    served in 16 bits (vLLM's `auto`)."""
    if dtype_flag and dtype_flag != "auto":
        return dtype_flag
    return "bfloat16" if config_dtype in ("float32", "float") else config_dtype


def kv_dtype_bytes(kv_cache_dtype: str | None, model_dtype: str) -> int:
    """Bytes per KV element: `--kv-cache-dtype` (auto = the model's dtype). ModelConfigError for a
    dtype vLLM does not accept."""
    name = model_dtype if kv_cache_dtype in (None, "auto") else kv_cache_dtype
    try:
        return DTYPE_BYTES[str(name).removeprefix("torch.")]
    except KeyError:
        known = ", ".join(sorted(DTYPE_BYTES))
        raise ModelConfigError(
            f"unknown dtype {name!r} for the KV cache; vLLM accepts: auto, {known}"
        ) from None


def hub_snapshot(model: str, revision: str | None, environ: Mapping[str, str]) -> Path | None:
    """The local snapshot directory of a Hugging Face hub id in the cache (HF_HUB_CACHE, else
    HF_HOME/hub, else ~/.cache/huggingface/hub), at `revision` or what refs/main points to; None
    when it is not cached."""
    if "/" not in model or model.startswith(("/", ".")):
        return None
    cache = environ.get("HF_HUB_CACHE") or os.path.join(
        environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub"
    )
    repo = Path(cache) / ("models--" + model.replace("/", "--"))
    ref = revision or "main"
    try:
        commit = (repo / "refs" / ref).read_text().strip()
    except OSError:
        commit = ref
    snapshot = repo / "snapshots" / commit
    return snapshot if (snapshot / "config.json").is_file() else None
