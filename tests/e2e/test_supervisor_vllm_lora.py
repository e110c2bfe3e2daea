"""A LoRA load and unload through the supervisor against a real vLLM CPU engine: each VERIFY reads the
KV capacity vLLM states (`vllm:cache_config_info` num_gpu_blocks) before and after, finds it whole, and
says the GPU memory is "not measured" (a CPU engine: no NVML figure, no memory gauge), never passed.
The adapter is written by benchmarks/gpu_sleep_cycle.py's own writer (zero B matrices), the one the
GPU check loads."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import DEV_ENV, SERVED_NAME, vllm_command, vllm_env
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import http_status, wait_until

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
ADAPTER = "tiny-lora"


def write_adapter(vllm_python: str, model: Path, out: Path) -> None:
    code = (
        "import sys, pathlib, gpu_sleep_cycle as g; g.write_adapter(sys.argv[1], pathlib.Path(sys.argv[2]))"
    )
    env = {**vllm_env(), "PYTHONPATH": f"{ROOT / 'benchmarks'}:{ROOT / 'src'}"}
    done = subprocess.run(
        [vllm_python, "-c", code, str(model), str(out)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]


def run(supervisor: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(supervisor + path, json=body, timeout=30)
    assert answer.status_code == 202, answer.text
    op_id = answer.json()["operation_id"]
    final: dict[str, Any] = {}

    def finished() -> bool:
        final.update(httpx.get(f"{supervisor}/v1/operations/{op_id}", timeout=30).json())
        return final["status"] != "running"

    wait_until(finished, 300, f"{path} finished")
    return final


def verify_of(op: dict[str, Any]) -> dict[str, Any]:
    (verify,) = [s for s in op["result"]["steps"] if s["step"] == "verify"]
    evidence: dict[str, Any] = verify["evidence"]
    return evidence


def test_lora_verify_reads_vllms_kv_capacity_and_says_memory_not_measured(
    vllm_python: str, tiny_model: Path, tmp_path: Path
) -> None:
    adapter = tmp_path / ADAPTER
    write_adapter(vllm_python, tiny_model, adapter)
    engine_port, supervisor_port = free_port(), free_port()
    supervisor_url = f"http://127.0.0.1:{supervisor_port}"
    engine = vllm_command(
        vllm_python, tiny_model, engine_port, "--enable-lora", "--max-loras", "1", "--max-lora-rank", "8"
    )
    supervisor = CorralProcess(
        ["supervise", "--port", str(supervisor_port), "--engine-url", f"http://127.0.0.1:{engine_port}",
         "--model", SERVED_NAME, "--state-dir", str(tmp_path / "state"), "--startup-timeout", "400",
         "--", *engine],
        env={**vllm_env(), **DEV_ENV},
    )  # fmt: skip
    try:
        wait_until(lambda: http_status(supervisor_url + "/readyz") == 200, 400, "READY")
        load = run(supervisor_url, "/v1/lora/load", {"name": ADAPTER, "path": str(adapter)})
        assert load["status"] == "succeeded", load
        loaded = verify_of(load)
        kv = loaded["kv_capacity"]
        assert kv["outcome"] == "passed", kv
        assert kv["before"]["num_gpu_blocks"] == kv["after"]["num_gpu_blocks"] > 0, kv
        assert loaded["memory"]["outcome"] == "not_measured", loaded["memory"]
        assert loaded["memory"]["reason"].startswith("not measured"), loaded["memory"]

        unload = run(supervisor_url, "/v1/lora/unload", {"name": ADAPTER})
        assert unload["status"] == "succeeded", unload
        unloaded = verify_of(unload)
        assert unloaded["kv_capacity"]["outcome"] == "passed", unloaded
        assert unloaded["memory"]["outcome"] == "not_measured", unloaded
    finally:
        supervisor.stop(grace=30)
