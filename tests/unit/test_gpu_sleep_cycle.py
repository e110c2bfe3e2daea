"""`benchmarks/gpu_sleep_cycle.py`, the prepared GPU check: where NVML sees no GPU it exits 2 saying so
(nothing started, no result file), and its table shows each step's memory verdict and GiB per GPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from corral.engine.gpus import read_gpus

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_sleep_cycle.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_sleep_cycle", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(read_gpus(), reason="a GPU is here: the check would run")
def test_without_a_gpu_it_exits_2_saying_so(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "no GPU here" in done.stderr
    assert not out.exists()


def test_the_table_has_a_row_per_step_with_its_verdict_and_gib() -> None:
    report = {
        "ready": {"memory_outcome": "passed", "engine_gib": {"GPU-0aaaaaaaaaaaa": 70.1}},
        "steps": [
            {
                "step": "sleep level 1",
                "status": "succeeded",
                "memory_outcome": "passed",
                "memory_source": "nvml",
                "engine_gib_after": {"GPU-0aaaaaaaaaaaa": 0.61},
            },
            {"step": "wake", "status": "refused", "engine_gib_after": None},
        ],
    }
    lines = load().table(report).splitlines()
    assert len(lines) == 4
    assert lines[2].split()[:5] == ["sleep", "level", "1", "succeeded", "passed"]
    assert "GPU-0aaaaaaa 0.61" in lines[2] and "nvml" in lines[2]
    assert lines[3].split()[:2] == ["wake", "refused"]
