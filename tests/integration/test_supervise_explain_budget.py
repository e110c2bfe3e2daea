"""`corral supervise --explain` with GPUs declared on the supervisor (`--gpus --gpu-memory-gib
--gpu-model`, a host without NVML): the memory budget's arithmetic printed, exit 1 when it does not fit
and 0 when it does, nothing started; `--headroom-gib` and `--weights-gib` change the lines they name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.engine.gpus import read_gpus
from tests.support.model_dirs import GIB, make_model_dir

pytestmark = pytest.mark.skipif(
    read_gpus() is not None, reason="NVML is present: its GPUs, not the declared ones, are the inventory"
)
CORRAL = str(Path(sys.executable).with_name("corral"))


def explain(tmp_path: Path, *flags: str, model: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "corral",
            "supervise",
            "--state-dir",
            str(tmp_path / "state"),
            *flags,
            "--explain",
            "--",
            CORRAL,
            "sim",
            "--model",
            str(model),
            "--port",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HF_HOME": str(tmp_path / "hf")},
    )


def flat(text: str) -> str:
    """The output with runs of spaces as one: the columns' widths are not what is checked here."""
    return " ".join(text.split())


def test_declared_gpus_size_the_budget_and_explain_prints_the_arithmetic(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m30", weights_bytes=30 * GIB, shards=3, max_position_embeddings=8192)
    small = explain(tmp_path, "--gpus", "1", "--gpu-memory-gib", "24", "--gpu-model", "L4", model=model)
    assert small.returncode == 1, small.stdout + small.stderr
    # the printed answer is the contract: what the person who ran the command reads
    assert "memory_budget refused" in flat(small.stdout)
    assert (
        "weights 30.00 GiB/rank + KV 1 seq 1.00 GiB + headroom 2.00 GiB = 33.00 GiB > 0.90 × 24.00 GiB = "
        "21.60 GiB by 11.40 GiB" in small.stdout
    )
    assert "usable/rank 21.60 GiB = --gpu-memory-utilization 0.9 × 24.00 GiB (GPU 0, L4, declared)" in flat(
        small.stdout
    )
    assert "start refused by memory_budget" in small.stdout
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())

    large = explain(tmp_path, "--gpus", "1", "--gpu-memory-gib", "80", model=model)
    assert large.returncode == 0, large.stdout + large.stderr
    assert "memory_budget passed" in flat(large.stdout) and "expected KV tokens 327,680" in flat(large.stdout)


def test_declared_headroom_and_weights_replace_their_lines(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m", weights_bytes=10 * GIB)
    out = flat(
        explain(
            tmp_path, "--gpu-memory-gib", "24", "--headroom-gib", "4", "--weights-gib", "12", model=model
        ).stdout
    )
    assert "headroom 4.00 GiB = --headroom-gib (replaces the estimates)" in out
    assert "weights/rank 12.00 GiB = --weights-gib 12.00 GiB; files: 10.00 GiB" in out
    assert "activation peak" not in out


def test_without_nvml_or_a_declaration_the_budget_is_not_measured(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m", weights_bytes=GIB)
    result = explain(tmp_path, model=model)
    assert result.returncode == 0, result.stdout + result.stderr
    # the printed answer is the contract: what the person who ran the command reads
    assert "parallel_identity  not_measured" in result.stdout
    assert "memory_budget      not_measured" in result.stdout
    assert (
        "not measured: memory_budget" in result.stdout or "not measured: parallel_identity" in result.stdout
    )
