"""docs/cli.md is the CLI reference generated from the click commands; it must match them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gen_cli_docs.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cli_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_current() -> None:
    generator = _generator()
    page: str = generator.render()
    committed = generator.PAGE.read_text(encoding="utf-8")
    assert committed == page, "docs/cli.md is stale: run scripts/gen_cli_docs.py"


def test_cli_reference_covers_nested_commands() -> None:
    page: str = _generator().render()
    for heading in (
        "## corral up",
        "## corral lora load",
        "## corral supervise prestop",
        "## corral k8s render",
    ):
        assert f"\n{heading}\n" in page, heading
    assert "--engine" in page.split("## corral sleep\n", 1)[1].split("\n## ", 1)[0]
