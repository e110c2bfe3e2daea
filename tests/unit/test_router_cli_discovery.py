"""`corral router` membership flags: each mode says what it is missing, in words a user can act on."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.router.cli import router


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "Name the engines: --backend URL"),
        (["--discovery", "k8s", "--selector", "app=vllm"], "needs --namespace NS and --selector"),
        (
            ["--discovery", "k8s", "--namespace", "n", "--selector", "a=b", "--backend", "http://x:1"],
            "takes no",
        ),
        (["--backend", "http://x:1", "--backends-file", "BAD"], "and no --backend"),
    ],
)
def test_usage_errors(args: list[str], message: str, tmp_path: Path) -> None:
    if "BAD" in args:
        path = tmp_path / "backends"
        path.write_text("http://y:2\n")
        args = [str(path) if a == "BAD" else a for a in args]
    result = CliRunner().invoke(router, args)
    assert result.exit_code == 2
    assert message in result.output


def test_a_bad_backends_file_is_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "backends"
    path.write_text("localhost:9000\n")
    result = CliRunner().invoke(router, ["--backends-file", str(path)])
    assert result.exit_code == 2
    assert "is not an engine; write one http(s)" in result.output
