"""Startup phases read from vLLM's log lines, and the restart policy's backoff and budget."""

from __future__ import annotations

import pytest

from corral.supervisor.lifecycle.engine_process import RestartPolicy, detect_phase
from corral.supervisor.lifecycle.states import StartingPhase as P

# Lines as the real vLLM CPU 0.32.0 engine logged them (tests/data/vllm-samples), and GPU-only ones.
REAL_LINES = [
    (
        "(Worker pid=22090) INFO [cpu_model_runner.py:68] Starting to load model /models/tiny...",
        P.LOADING_MODEL,
    ),
    (
        "(Worker pid=22090) INFO [default_loader.py:501] Loading weights took 0.01 seconds",
        P.LOADING_MODEL,
    ),
    (
        "(Worker pid=22090) INFO [cpu_model_runner.py:87] Warming up model for the compilation...",
        P.CAPTURING_GRAPHS,
    ),
    (
        "(EngineCore pid=22075) INFO [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens",
        P.ALLOCATING_KV_CACHE,
    ),
    ("INFO [gpu_worker.py:298] Available KV cache memory: 8.00 GiB", P.ALLOCATING_KV_CACHE),
    ("INFO [gpu_model_runner.py:2800] Graph capturing finished in 5 secs, took 0.5 GiB", P.SERVER_STARTING),
    (
        "(EngineCore pid=22075) INFO [core.py:402] init engine (profile, create kv cache, "
        "warmup model) took 10.98 s",
        P.SERVER_STARTING,
    ),
    (
        "(APIServer pid=22059) INFO [entry.py:140] Starting vLLM server on http://0.0.0.0:8100",
        P.SERVER_STARTING,
    ),
]


@pytest.mark.parametrize(("line", "phase"), REAL_LINES)
def test_phase_from_real_log_lines(line: str, phase: P) -> None:
    assert detect_phase(line) is phase


def test_other_lines_are_no_phase() -> None:
    assert detect_phase('INFO:     127.0.0.1:40924 - "GET /health HTTP/1.1" 200 OK') is None
    assert detect_phase("(APIServer pid=1) INFO [model.py:2152] Using max model len 256") is None


def test_backoff_doubles_to_the_cap_within_the_budget() -> None:
    policy = RestartPolicy(budget=5, initial=1.0, cap=5.0)
    assert [policy.next_backoff() for _ in range(6)] == [1.0, 2.0, 4.0, 5.0, 5.0, None]
    policy.reset()
    assert policy.next_backoff() == 1.0
    assert RestartPolicy(budget=0).next_backoff() is None
