"""A LoRA load's and unload's VERIFY read the engine's GPU memory and KV capacity before and after,
on `corral sim` configured as vLLM is (`--no-memory-metrics`: no memory figure of its own, so the memory
is NVML's or "not measured", never a silent pass; the KV capacity from `vllm:cache_config_info`, which
vLLM states), and fail a load that took KV blocks, with both figures."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.integration.test_supervisor_lora import ENV, run_op, steps
from tests.integration.test_supervisor_support import Supervised, kill_leftovers, start_supervised

AS_VLLM = ("--enable-lora", "--max-loras", "2", "--no-memory-metrics")


def verify_evidence(sup: Supervised, op_id: str) -> dict[str, Any]:
    (verify,) = [r for r in steps(sup, op_id) if r["step"] == "verify"]
    evidence: dict[str, Any] = verify["evidence"]
    return evidence


async def test_load_and_unload_record_kv_capacity_and_say_memory_not_measured(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter-a"
    adapter.mkdir()
    sup = start_supervised(sim_args=AS_VLLM, env=ENV)
    try:
        await asyncio.to_thread(sup.wait_state, "READY", 30)
        load = await asyncio.to_thread(
            run_op, sup, "/v1/lora/load", {"name": "adapter-a", "path": str(adapter), "operation_id": "ld"}
        )
        assert load["status"] == "succeeded", load
        loaded = verify_evidence(sup, "ld")
        kv = loaded["kv_capacity"]
        assert kv["outcome"] == "passed", kv
        assert kv["before"]["num_gpu_blocks"] == kv["after"]["num_gpu_blocks"] > 0, kv
        memory = loaded["memory"]
        assert memory["outcome"] == "not_measured", memory
        assert memory["reason"].startswith("not measured"), memory

        unload = await asyncio.to_thread(
            run_op, sup, "/v1/lora/unload", {"name": "adapter-a", "operation_id": "un"}
        )
        assert unload["status"] == "succeeded", unload
        unloaded = verify_evidence(sup, "un")
        assert unloaded["kv_capacity"]["outcome"] == "passed", unloaded
        assert unloaded["memory"]["outcome"] == "not_measured", unloaded
        # the change record carries VERIFY's figures
        record = unload["result"]["change_record"]
        (recorded,) = [s for s in record["steps"] if s["step"] == "verify"]
        assert recorded["data"]["kv_capacity"] == unloaded["kv_capacity"], record
        assert sup.state()["memory"]["last"]["operation"] == "lora_unload"
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)


async def test_a_load_that_takes_kv_blocks_fails_verify_with_the_figures(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter-a"
    adapter.mkdir()
    sup = start_supervised(sim_args=(*AS_VLLM, "--fail-lora-kv-blocks", "64"), env=ENV)
    try:
        await asyncio.to_thread(sup.wait_state, "READY", 30)
        load = await asyncio.to_thread(
            run_op, sup, "/v1/lora/load", {"name": "adapter-a", "path": str(adapter), "operation_id": "ld"}
        )
        assert load["status"] == "failed", load
        (verify,) = [r for r in steps(sup, "ld") if r["step"] == "verify"]
        assert verify["status"] == "failed", verify
        assert "cut the KV cache" in str(verify), verify
        kv = verify["evidence"]["kv_capacity"]
        assert kv["before"]["num_gpu_blocks"] - kv["after"]["num_gpu_blocks"] == 64, kv
        # RECOVER unloaded it again: neither served nor desired
        state = sup.state()
        assert state["adapters"]["served"] == [] and "adapter-a" not in state["adapters"]["desired"], state
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)
