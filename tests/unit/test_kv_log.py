"""vLLM's startup log read for memory: the KV cache size line (GPU and CPU, thousands separators, with or
without the concurrency tail), the weights' and KV cache's shares, and the KV capacity decision against
the memory budget (a shortfall beyond the tolerance, or below one --max-model-len sequence)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.engine.kv_log import GIB, EngineLogFigures, kv_cache_size, kv_capacity

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "vllm-samples" / "engine_startup_and_shutdown.log"
CPU_LINE = (
    "(EngineCore pid=22075) INFO 12-02 09:43:40 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 "
    "tokens, Maximum concurrency for 256 tokens per request: 8192.00x"
)
GPU_LINE = (
    "(EngineCore_DP0 pid=81) INFO 12-03 10:00:01 [kv_cache_utils.py:1087] GPU KV cache size: 1,234,560 tokens"
)


def test_the_cpu_line_of_a_real_vllm_log() -> None:
    size = kv_cache_size(CPU_LINE)
    assert size is not None and (size.device, size.tokens) == ("CPU", 2_097_152)


def test_the_gpu_line_with_commas_and_without_them() -> None:
    size = kv_cache_size(GPU_LINE)
    assert size is not None and (size.device, size.tokens) == ("GPU", 1_234_560)
    plain = kv_cache_size("INFO [kv_cache_utils.py:1] GPU KV cache size: 4096 tokens")
    assert plain is not None and plain.tokens == 4096


@pytest.mark.parametrize(
    "line",
    [
        "INFO [loggers.py:335] Engine 000: Running: 1 reqs, GPU KV cache usage: 0.0%",
        "INFO [utils.py:347] Using LBHNC KV cache layout.",
        "GPU KV cache size: many tokens",
    ],
)
def test_other_lines_carry_no_size(line: str) -> None:
    assert kv_cache_size(line) is None


def test_a_whole_real_log_gives_its_one_size() -> None:
    figures = EngineLogFigures()
    for line in SAMPLES.read_text().splitlines():
        figures.note(line)
    assert figures.kv_cache_tokens == 2_097_152
    assert figures.to_json()["kv_cache_device"] == "CPU"


def test_the_shares_per_rank_and_the_smallest_of_several_engine_cores() -> None:
    figures = EngineLogFigures()
    assert figures.note(
        "(Worker_TP0 pid=9) INFO [gpu_model_runner.py:2] Model loading took 0.93 GiB memory and 3.1 s"
    )
    assert figures.note("(Worker_TP0 pid=9) INFO [gpu_worker.py:298] Available KV cache memory: 30.50 GiB")
    assert figures.note(GPU_LINE)
    assert figures.note(GPU_LINE.replace("1,234,560", "1,000,000").replace("DP0", "DP1"))
    assert not figures.note("INFO something else")
    assert figures.weights_bytes == int(0.93 * GIB)
    assert figures.kv_cache_bytes == int(30.5 * GIB)
    assert figures.kv_cache_tokens == 1_000_000


def test_within_the_tolerance_passes_and_beyond_it_is_a_shortfall() -> None:
    assert kv_capacity(95_000, 100_000, 2048, 0.10).outcome == "passed"
    assert kv_capacity(120_000, 100_000, 2048, 0.10).outcome == "passed"
    short = kv_capacity(80_000, 100_000, 2048, 0.10)
    assert short.shortfall and "20% below the budget's 100,000" in short.reason


def test_below_one_sequence_is_a_shortfall_whatever_the_budget() -> None:
    short = kv_capacity(1000, None, 2048)
    assert short.shortfall and "less than one --max-model-len sequence (2,048)" in short.reason


def test_no_line_or_no_budget_is_not_measured_never_passed() -> None:
    assert kv_capacity(None, 100_000, 2048).outcome == "not_measured"
    assert kv_capacity(50_000, None, None).outcome == "not_measured"
