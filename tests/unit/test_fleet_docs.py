"""docs/fleet-yaml.md and docs/bundle.md show the fields the models have (scripts/doc_tables.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from corral.bundle_spec import BundleSpec
from corral.fleet.local.fleet_config import EnginesConfig, FleetConfig, RouterConfig

ROOT = Path(__file__).resolve().parents[2]


def test_the_field_tables_are_current() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "doc_tables.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


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
