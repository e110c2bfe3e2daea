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
    sys.modules[spec.name] = module  # its dataclasses look their module up there
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
    # the refusal is the contract: one line naming the value and what to do
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


def test_the_host_ram_refusal_must_name_host_memory_and_leave_the_engine_ready() -> None:
    gpu = load()
    (short,) = [op for op in gpu.OPERATIONS if op.expect == "refused"]
    assert short.host_room == gpu.HOST_RAM_SHORT and short.body["level"] == 1
    message = "sleep level 1 refused: the weights' backup needs 0.92 GiB of host memory, from …"
    row = {"status": "refused", "answer": {"error": {"message": message}}}
    assert all(gpu.step_checks(short, row, {"state": "READY"}, {"state": "READY"}).values())
    moved = gpu.step_checks(short, {"status": "succeeded"}, {"state": "READY"}, {"state": "SLEEPING"})
    assert not moved["status refused"] and not moved["nothing moved: READY"]


def operation_row(step: str, evidence: dict[str, object], **fields: object) -> dict[str, object]:
    steps = [{"step": step, "status": "passed", "evidence": evidence}]
    return {
        "status": "succeeded",
        "memory_outcome": "passed",
        "memory_source": "nvml",
        "operation": {"result": {"steps": steps}},
        **fields,
    }


def test_a_level_1_sleep_must_have_checked_host_ram_on_the_model_files() -> None:
    gpu = load()
    sleep_1 = next(op for op in gpu.OPERATIONS if op.name == "sleep level 1")
    backup = {"source": "precheck_budget", "weights_bytes": 988 << 20}
    row = operation_row("precheck", {"host_ram": {"outcome": "passed", "backup": backup}})
    assert all(gpu.step_checks(sleep_1, row, {}, {}).values())
    unmeasured = operation_row("precheck", {"host_ram": {"outcome": "not_measured", "backup": {}}})
    assert not gpu.step_checks(sleep_1, unmeasured, {}, {})["host RAM passed on the model files' size"]


def test_the_kv_release_and_its_wake_check_the_gauge_and_the_prefix_epoch() -> None:
    gpu = load()
    release = next(op for op in gpu.OPERATIONS if op.body.get("release_kv"))
    wake = gpu.OPERATIONS[gpu.OPERATIONS.index(release) + 1]
    assert all(gpu.step_checks(release, operation_row("verify", {"sleep_state": None}), {}, {}).values())
    offloaded = operation_row("verify", {"sleep_state": "weights_offloaded"})
    assert not all(gpu.step_checks(release, offloaded, {}, {}).values())
    asleep = {"sleep": {"level": 0, "kv_released": True}, "prefix_cache": {"epoch": "41:0"}}
    woken = operation_row("verify", {"prefix_cache": {"prefix_epoch": "41:1"}})
    assert gpu.step_checks(wake, woken, asleep, {"prefix_cache": {"epoch": "41:1"}})["prefix epoch moved"]
    assert not gpu.step_checks(wake, woken, asleep, {"prefix_cache": {"epoch": "41:0"}})["prefix epoch moved"]
