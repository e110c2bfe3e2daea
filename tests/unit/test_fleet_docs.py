"""docs/fleet-yaml.md and docs/bundle.md show the fields the models have (scripts/doc_tables.py)."""

from __future__ import annotations

from pathlib import Path

from corral.bundle_spec import BundleSpec
from corral.fleet.local.fleet_config import EnginesConfig, FleetConfig, RouterConfig
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_the_field_tables_are_current() -> None:
    generator = load_script("doc_tables")
    for doc in generator.DOCS:
        committed = doc.read_text(encoding="utf-8")
        assert generator.render(committed) == committed, f"{doc} is stale: run scripts/doc_tables.py"


def test_every_field_is_in_its_page() -> None:
    fleet = (ROOT / "docs" / "fleet-yaml.md").read_text()
    bundle = (ROOT / "docs" / "bundle.md").read_text()
    for model, page in (
        (FleetConfig, fleet),
        (EnginesConfig, fleet),
        (RouterConfig, fleet),
        (BundleSpec, bundle),
    ):
        for name in model.model_fields:
            assert f"| `{name}` |" in page, (model.__name__, name)
