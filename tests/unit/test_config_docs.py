"""docs/corral-yaml.md is generated from the configuration model `corral k8s render` reads; it must
match it, and name every key of that model."""

from __future__ import annotations

from types import ModuleType

from corral.k8s.render.config import CorralDeployment
from tests.support.scripts import load_script


def _generator() -> ModuleType:
    return load_script("gen_config_docs")


def test_corral_yaml_reference_is_current() -> None:
    generator = _generator()
    page: str = generator.render()
    committed = generator.PAGE.read_text(encoding="utf-8")
    assert committed == page, "docs/corral-yaml.md is stale: run scripts/gen_config_docs.py"


def test_corral_yaml_reference_names_every_key() -> None:
    page: str = _generator().render()
    top = page.split("## Top level\n", 1)[1].split("\n## ", 1)[0]
    for name in CorralDeployment.model_fields:
        assert f"- `{name}` (" in top, name
    drain = page.split("\n## drain\n", 1)[1].split("\n## ", 1)[0]
    assert "- `longest_stream_seconds` (number; required)" in drain
    assert "## engine.volumes" in page
