"""Bad input to `corral supervise`: one line on stderr naming the value, exit code 2, nothing started
(no state dir written, no engine run, no port bound)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SIM = [sys.executable, "-m", "corral", "sim", "--port", "1"]


def run_supervise(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", "supervise", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--wait-for", "redis://cache:6379", "--", *SIM], "redis://cache:6379"),
        (["--wait-for", "unix:/ok.sock", "--wait-for", "vineyard", "--", *SIM], "vineyard"),
        (["--", "/opt/nowhere/vllm", "serve", "m"], "/opt/nowhere/vllm"),
        (["--", "no-such-engine-binary-xyz", "serve"], "no-such-engine-binary-xyz"),
        (["--token-file", "/nonexistent/token", "--", *SIM], "/nonexistent/token"),
        (["--host", "0.0.0.0", "--", *SIM], "0.0.0.0"),
        (["--", *SIM, "--kv-transfer-config", '{"kv_connector": "N", "kv_role": "kv_prod"}'], "kv_prod"),
        ([], "no engine command"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], named: str) -> None:
    state_dir = tmp_path / "state"
    result = run_supervise("--port", "1", "--state-dir", str(state_dir), *args)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], result.stderr
    # the refusal is the contract: one line naming the value and what to do
    assert result.stdout == ""
    assert not state_dir.exists()


def test_unreadable_token_files(tmp_path: Path) -> None:
    for path, why in ((tmp_path, "directory"), (tmp_path / "empty", "empty")):
        if why == "empty":
            path.write_text("\n")
        result = run_supervise("--token-file", str(path), "--", *SIM)
        assert result.returncode == 2
        line = result.stderr.strip()
        assert "\n" not in line and str(path) in line and why in line.lower(), line


def test_prestop_with_an_unreadable_token_file() -> None:
    result = run_supervise("prestop", "--token-file", "/nonexistent/token")
    # the refusal is the contract: one line naming the value and what to do
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "/nonexistent/token" in result.stderr
