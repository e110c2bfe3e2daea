"""Every Kubernetes example under deploy/examples renders through `corral k8s render` with no warning:
an example is what a reader copies, so it must not show a risk the render itself points out."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
CONFIGS = sorted(EXAMPLES.glob("*/corral.yaml"))


def test_the_examples_are_found() -> None:
    names = {c.parent.name for c in CONFIGS}
    assert {"minimal", "monitoring", "pd", "wait-for-kv-cache"} <= names, names


@pytest.mark.parametrize("config", CONFIGS, ids=[c.parent.name for c in CONFIGS])
def test_example_renders_without_a_warning(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "rendered"
    result = CliRunner().invoke(main, ["k8s", "render", "--config", str(config), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert any(out.glob("*.yaml"))
    # the printed answer is the contract: what the person who ran the command reads
    assert "warning" not in result.stderr, result.stderr
