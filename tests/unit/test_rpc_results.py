"""Reading vLLM's `collective_rpc` per rank (`engine/rpc_results.py`) on the bodies and log lines vLLM
gives: one result per worker, and the rank whose worker logged the exception."""

from __future__ import annotations

import pytest

from corral.engine.rank_lines import ParallelSize
from corral.engine.rpc_results import answered_ranks, failed_ranks

TP2 = ParallelSize(tensor=2)


def test_one_null_result_per_rank_is_every_rank_reloaded() -> None:
    ranks, problem = answered_ranks({"results": [None, None]}, TP2)
    assert problem is None
    assert [(r.rank, r.ok) for r in ranks] == [(0, True), (1, True)]


@pytest.mark.parametrize("body", [{"results": [None]}, {"results": []}, None, "", {"status": "ok"}])
def test_fewer_results_than_ranks_or_no_results_is_a_problem(body: object) -> None:
    _, problem = answered_ranks(body, TP2)
    assert problem is not None and "collective_rpc answered" in problem


def test_a_data_parallel_engine_may_answer_for_one_core_or_all() -> None:
    size = ParallelSize(tensor=2, data=2)
    assert answered_ranks({"results": [None] * 2}, size)[1] is None
    assert answered_ranks({"results": [None] * 4}, size)[1] is None
    assert answered_ranks({"results": [None] * 3}, size)[1] is not None


def test_the_failing_rank_is_the_worker_that_logged_the_exception() -> None:
    lines = [
        "(APIServer pid=10) INFO 12-06 21:00:00 [api_server.py:1] POST /collective_rpc",
        "(Worker_TP0 pid=11) INFO 12-06 21:00:00 [gpu_model_runner.py:1] Reloading weights inplace...",
        "(Worker_TP1 pid=12) ERROR 12-06 21:00:01 [multiproc_executor.py:816] WorkerProc hit an exception.",
        "(Worker_TP1 pid=12) ERROR 12-06 21:00:01 [multiproc_executor.py:816] Traceback (most recent call):",
        "(Worker_TP0 pid=11) INFO 12-06 21:00:01 [gpu_model_runner.py:2] Reloading weights took 0.5 seconds",
        "(Worker_TP1 pid=12) ERROR 12-06 21:00:01 [multiproc_executor.py:816] RuntimeError: size mismatch",
    ]
    (failed,) = failed_ranks(lines, TP2)
    assert (failed.rank, failed.worker, failed.pid, failed.ok) == (1, "Worker_TP1", 12, False)
    assert failed.error == "RuntimeError: size mismatch"
    assert failed.label() == "rank 1 (Worker_TP1 pid 12)"


def test_no_worker_line_names_no_rank() -> None:
    assert failed_ranks(["(EngineCore_DP0 pid=3) ERROR [core.py:1] something else"], TP2) == []
