"""The simulator's memory arithmetic against the supervisor's PRECHECK budget, two independent estimates of
the same start: they agree on weights and KV bytes per token, and PRECHECK never authorizes a start the
engine then refuses (its headroom covers the simulator's overhead)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.engine.model_config import DTYPE_BYTES as PRECHECK_DTYPE_BYTES
from corral.sim.core.config import SimConfig
from corral.sim.core.model_dir import DTYPE_BYTES as SIM_DTYPE_BYTES
from corral.sim.core.sizing import size_engine
from corral.supervisor.precheck.budget import BudgetOverrides, compute_budget, memory_budget
from corral.supervisor.precheck.check import Outcome
from corral.supervisor.precheck.inventory import read_inventory
from tests.support.model_dirs import GIB, make_model_dir

CASES = [
    # weights GiB, device GiB, TP, max_model_len, kv cache dtype
    (30, 24, 1, 8192, "auto"),
    (30, 32, 1, 8192, "auto"),
    (30, 36, 1, 131072, "auto"),
    (30, 36, 1, 4096, "auto"),  # the engine would start; PRECHECK, more cautious, refuses
    (30, 40, 1, 8192, "auto"),
    (30, 80, 1, 8192, "auto"),
    (30, 24, 2, 8192, "auto"),
    (30, 24, 2, 131072, "fp8"),
    (60, 40, 2, 32768, "auto"),
    (14, 16, 1, 4096, "auto"),
    (140, 80, 4, 131072, "fp8"),
]


@pytest.mark.parametrize(("weights", "device", "tp", "max_len", "kv_dtype"), CASES)
def test_precheck_and_the_simulator_agree(
    tmp_path: Path, weights: int, device: int, tp: int, max_len: int, kv_dtype: str
) -> None:
    model = make_model_dir(
        tmp_path / "m", weights_bytes=weights * GIB, shards=4, max_position_embeddings=131072
    )
    argv = [
        "corral",
        "sim",
        "--model",
        str(model),
        "--gpu-memory-gib",
        str(device),
        "--tensor-parallel-size",
        str(tp),
        "--max-model-len",
        str(max_len),
        "--kv-cache-dtype",
        kv_dtype,
    ]
    inventory = read_inventory(argv, {})
    budget = compute_budget(argv, inventory, BudgetOverrides(), {})
    check = memory_budget(argv, inventory, environ={})
    sim = size_engine(
        SimConfig(
            model=str(model),
            gpu_memory_gib=float(device),
            tensor_parallel_size=tp,
            max_model_len=max_len,
            kv_cache_dtype=kv_dtype,
        )
    )
    assert budget.weights_bytes_per_rank == sim.weights_bytes
    assert sim.plan is None or budget.kv_bytes_per_token == sim.plan.kv_bytes_per_token
    if check.outcome is Outcome.PASSED:
        assert sim.plan is not None, f"PRECHECK authorized a start the engine refuses: {sim.memory_error}"
        assert budget.expected_kv_tokens is not None
        assert budget.expected_kv_tokens <= sim.plan.kv_cache_tokens  # the budget is the cautious one
    if sim.plan is None:
        assert check.outcome is Outcome.REFUSED, check.reason


def test_precheck_sizes_every_dtype_the_simulator_sizes_and_alike() -> None:
    # two tables on purpose (each estimate its own), but a dtype the simulator sizes must be one PRECHECK
    # sizes too, at the same bytes per element: else PRECHECK refuses or misjudges a start the engine takes
    shared = {name: PRECHECK_DTYPE_BYTES.get(name) for name in SIM_DTYPE_BYTES}
    assert shared == SIM_DTYPE_BYTES
