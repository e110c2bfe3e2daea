"""A simulator over a checkpoint directory on a simulated GPU: it fails as vLLM fails when the model does not
fit, and otherwise serves under its served name with the KV cache its arithmetic gives."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from corral.sim.core.device import GIB, OVERHEAD_BYTES
from tests.support.model_dirs import make_model_dir
from tests.support.procs import start_sim

KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # the default make_model_dir shape, bf16


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        body: dict[str, object] = json.loads(resp.read())
        return body


def test_30_gib_of_weights_on_a_24_gib_device_exit_1_with_cuda_oom(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m30", weights_bytes=30 * GIB, shards=4)
    proc, _ = start_sim(None, "--gpu-memory-gib", "24", model=str(model), wait=False)
    try:
        assert proc.wait_exit(timeout=20) == 1
        out = proc.output()
        # the log lines are the contract: vLLM writes them so, and the supervisor and operators read them
        assert "torch.OutOfMemoryError: CUDA out of memory." in out
        assert "GPU 0 has a total capacity of 24.00 GiB" in out
        assert out.index("Starting to load model") < out.index("CUDA out of memory")
        assert "Engine core initialization failed" in out
        assert "Starting vLLM server" not in out
    finally:
        proc.stop()


def test_kv_cache_too_small_for_one_sequence_logs_the_memory_then_vllms_value_error(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m30", weights_bytes=30 * GIB, max_position_embeddings=131072)
    proc, _ = start_sim(None, "--gpu-memory-gib", "36", model=str(model), wait=False)
    try:
        assert proc.wait_exit(timeout=20) == 1
        out = proc.output()
        # the log lines are the contract: vLLM writes them so, and the supervisor and operators read them
        assert "Available KV cache memory: 1.4 GiB" in out
        assert "ValueError: To serve at least one request with the models's max seq len (131072)" in out
        assert out.index("Model loading took 30.0000 GiB") < out.index("Available KV cache memory")
        assert "Starting vLLM server" not in out
    finally:
        proc.stop()


def test_the_same_model_on_80_gib_serves_its_name_and_kv_from_the_arithmetic(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m30", weights_bytes=30 * GIB, max_position_embeddings=8192)
    proc, url = start_sim(None, "--gpu-memory-gib", "80", "--served-model-name", "llama-30", model=str(model))
    try:
        models = _get(url + "/v1/models")
        [card] = models["data"]  # type: ignore[misc]
        assert card["id"] == "llama-30" and card["root"] == str(model)
        assert card["max_model_len"] == 8192  # from config.json's max_position_embeddings
        blocks = (int(80 * GIB * 0.9) - 30 * GIB - OVERHEAD_BYTES) // (16 * KV_PER_TOKEN)
        out = proc.output()
        # the log lines are the contract: vLLM writes them so, and the supervisor and operators read them
        assert f"GPU KV cache size: {blocks * 16:,} tokens" in out
        assert f"Maximum concurrency for 8,192 tokens per request: {blocks / 512:.2f}x" in out
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        weights = re.search(r'corral_sim_gpu_memory_bytes\{[^}]*kind="weights"[^}]*\} (\S+)', metrics)
        kv = re.search(r'corral_sim_gpu_memory_bytes\{[^}]*kind="kv_cache"[^}]*\} (\S+)', metrics)
        assert weights is not None and float(weights.group(1)) == 30 * GIB
        assert kv is not None and float(kv.group(1)) == blocks * 16 * KV_PER_TOKEN
        body = json.dumps({"model": "llama-30", "prompt": "hello", "max_tokens": 2}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert json.loads(resp.read())["model"] == "llama-30"
    finally:
        assert proc.stop() == 0
