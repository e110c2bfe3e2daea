"""Model directories for tests: a `config.json` and `*.safetensors` files of any size, written sparse
(a valid safetensors header, then a hole), so a "30 GiB" checkpoint costs a few KiB of disk."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

GIB = 1 << 30


def make_model_dir(
    path: Path,
    *,
    weights_bytes: int = 1 * GIB,
    shards: int = 1,
    num_hidden_layers: int = 32,
    num_attention_heads: int = 32,
    num_key_value_heads: int = 8,
    hidden_size: int = 4096,
    head_dim: int | None = None,
    torch_dtype: str = "bfloat16",
    max_position_embeddings: int = 8192,
    extra_config: dict[str, Any] | None = None,
) -> Path:
    """A directory like a Hugging Face checkpoint: config.json, tokenizer_config.json, and `shards`
    safetensors files whose sizes add up to `weights_bytes`."""
    path.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "hidden_size": hidden_size,
        "torch_dtype": torch_dtype,
        "max_position_embeddings": max_position_embeddings,
        "vocab_size": 32000,
    }
    if head_dim is not None:
        config["head_dim"] = head_dim
    config.update(extra_config or {})
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": max_position_embeddings}))
    per_shard = weights_bytes // shards
    for i in range(shards):
        size = per_shard if i < shards - 1 else weights_bytes - per_shard * (shards - 1)
        name = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        header = json.dumps({"__metadata__": {"format": "pt"}}).encode()
        with (path / name).open("wb") as fh:
            fh.write(struct.pack("<Q", len(header)) + header)
            fh.truncate(max(size, 8 + len(header)))
    return path
