"""The LoRA VERIFY figures: the KV cache read from `vllm:cache_config_info` (a real vLLM page, the
smallest engine core, anything else a clear None) and the judgements on memory and KV capacity."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.engine.kv_config import KvBlocks, kv_blocks
from corral.supervisor.lifecycle.device_memory import NVML
from corral.supervisor.runbook.change_record import MemoryReading
from corral.supervisor.runbook.lora_memory import (
    MEMORY_TOLERANCE_BYTES,
    Footprint,
    kv_verdict,
    load_memory_verdict,
    unload_memory_verdict,
)

REAL = (Path(__file__).parents[1] / "data" / "vllm-samples" / "metrics.body").read_text()
GIB = 2**30


def footprint(gpu: int | None, blocks: int | None = 1000, source: str = NVML) -> Footprint:
    memory = MemoryReading(source, gpu) if gpu is not None else None
    kv = KvBlocks(blocks, 16) if blocks is not None else None
    return Footprint(
        memory, "" if memory else "not measured: no NVML", kv, "" if kv else "not measured: no info"
    )


def test_the_kv_cache_of_a_real_vllm_page() -> None:
    assert kv_blocks(REAL) == KvBlocks(16384, 128)


def test_the_smallest_engine_core_and_pages_without_a_figure() -> None:
    page = (
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="900"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="800"} 1.0\n'
    )
    assert kv_blocks(page) == KvBlocks(800, 16)
    assert kv_blocks('vllm:cache_config_info{engine="0",num_gpu_blocks="None"} 1.0\n') is None
    assert kv_blocks("vllm:num_requests_running 0\n") is None
    assert kv_blocks(b"") is None


@settings(deadline=None, max_examples=200)
@given(st.text(max_size=40), st.text(max_size=40))
def test_hostile_labels_never_raise(blocks: str, size: str) -> None:
    escaped = [v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for v in (blocks, size)]
    page = f'vllm:cache_config_info{{num_gpu_blocks="{escaped[0]}",block_size="{escaped[1]}"}} 1.0\n'
    found = kv_blocks(page)
    assert found is None or found.num_gpu_blocks >= 0


def test_a_load_that_takes_kv_blocks_fails_with_both_figures() -> None:
    verdict = kv_verdict("the load", footprint(10 * GIB, 1000), footprint(10 * GIB, 990))
    assert verdict["outcome"] == "failed" and "1,000 to 990 blocks" in verdict["reason"]
    assert verdict["before"]["num_gpu_blocks"] == 1000 and verdict["after"]["num_gpu_blocks"] == 990
    assert kv_verdict("the load", footprint(None, 1000), footprint(None, 1000))["outcome"] == "passed"


def test_kv_not_stated_is_not_measured_never_passed() -> None:
    verdict = kv_verdict("the load", footprint(None, None), footprint(None, None))
    assert verdict["outcome"] == "not_measured" and verdict["reason"].startswith("not measured")


def test_memory_unread_is_not_measured() -> None:
    assert load_memory_verdict(footprint(None), footprint(None)).outcome == "not_measured"
    verdict = unload_memory_verdict(footprint(None), footprint(5 * GIB), 0)
    assert verdict.outcome == "not_measured" and verdict.reason == "not measured: no NVML"
    mixed = unload_memory_verdict(footprint(5 * GIB, source="engine_metrics"), footprint(5 * GIB), 0)
    assert mixed.outcome == "not_measured"


def test_an_unload_that_frees_nothing_its_load_took_fails() -> None:
    load = load_memory_verdict(footprint(10 * GIB), footprint(11 * GIB))
    assert load.outcome == "passed" and load.evidence["growth_bytes"] == GIB
    kept = unload_memory_verdict(footprint(11 * GIB), footprint(11 * GIB), GIB)
    assert kept.failed and "did not free memory" in kept.reason, kept
    assert kept.evidence["freed_bytes"] == 0 and kept.evidence["before"]["gpu_bytes"] == 11 * GIB
    freed = unload_memory_verdict(footprint(11 * GIB), footprint(10 * GIB), GIB)
    assert freed.outcome == "passed"


def test_an_unload_that_grows_memory_fails_and_noise_passes() -> None:
    grew = unload_memory_verdict(footprint(10 * GIB), footprint(10 * GIB + 2 * MEMORY_TOLERANCE_BYTES), None)
    assert grew.failed and "more after it" in grew.reason
    # vLLM's preallocated slots: its load took nothing, so an unload that frees nothing is right
    noise = unload_memory_verdict(footprint(10 * GIB), footprint(10 * GIB + MEMORY_TOLERANCE_BYTES // 2), 0)
    assert noise.outcome == "passed"
