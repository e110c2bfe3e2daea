"""docs/cli.md is the CLI reference generated from the click commands; it must match them."""

from __future__ import annotations

from types import ModuleType

from tests.support.scripts import load_script


def _generator() -> ModuleType:
    return load_script("gen_cli_docs")


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
