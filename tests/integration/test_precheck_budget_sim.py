"""PRECHECK's memory budget against a real `corral sim` on the same model directory and simulated GPU:
the simulator logs vLLM's startup lines (weights loaded, available KV memory, KV cache size in
tokens), and the budget's figures must agree with them, the KV tokens differing only by the headroom
the two estimate differently (the budget's documented lines against the simulator's one overhead).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from corral.supervisor.precheck.budget import KV_BLOCK_TOKENS, BudgetOverrides, compute_budget, memory_budget
from corral.supervisor.precheck.check import Outcome
from corral.supervisor.precheck.inventory import read_inventory
from tests.support.model_dirs import GIB, make_model_dir
from tests.support.procs import start_sim

LOGGED_GIB_ROUNDING = 0.05 * GIB  # vLLM logs "Available KV cache memory" to a tenth or hundredth of a GiB


def _logged(output: str, pattern: str) -> float:
    found = re.findall(pattern, output)
    assert found, f"{pattern!r} not in the simulator's log:\n{output}"
    return float(found[-1].replace(",", ""))


@pytest.mark.parametrize("tp", [1, 2])
def test_expected_kv_tokens_match_the_simulators_log_up_to_the_headroom(tmp_path: Path, tp: int) -> None:
    model = make_model_dir(tmp_path / "m", weights_bytes=15 * GIB, shards=2, max_position_embeddings=8192)
    sim_args = ["--gpu-memory-gib", "24", "--tensor-parallel-size", str(tp), "--startup-seconds", "0"]
    argv = ["corral", "sim", "--model", str(model), *sim_args]
    inventory = read_inventory(argv, {}, nvml=lambda: None)
    budget = compute_budget(argv, inventory, BudgetOverrides(), environ={})
    assert memory_budget(argv, inventory, environ={}).outcome is Outcome.PASSED

    proc, _url = start_sim(None, *sim_args, model=str(model))
    try:
        out = proc.output()
        weights = _logged(out, r"Model loading took ([\d.]+) GiB memory")
        available = _logged(out, r"Available KV cache memory: ([\d.]+) GiB")
        tokens = int(_logged(out, r"GPU KV cache size: ([\d,]+) tokens"))
    finally:
        proc.stop()

    per_token = budget.kv_bytes_per_token
    expected = budget.expected_kv_tokens
    assert per_token is not None and expected is not None and budget.usable_bytes is not None
    # the same weights per rank and the same KV bytes per token (the simulator's tokens fill its KV memory)
    assert weights * GIB == pytest.approx(budget.weights_bytes_per_rank, abs=0.001 * GIB)
    assert tokens * per_token == pytest.approx(
        available * GIB, abs=LOGGED_GIB_ROUNDING + KV_BLOCK_TOKENS * per_token
    )
    # what is left differs by the headroom only: the budget's lines against the simulator's overhead
    sim_overhead = budget.usable_bytes - weights * GIB - available * GIB
    assert (tokens - expected) * per_token == pytest.approx(
        budget.headroom_bytes - sim_overhead, abs=LOGGED_GIB_ROUNDING + KV_BLOCK_TOKENS * per_token
    )
    assert tokens >= expected  # the budget's headroom is the more cautious estimate
