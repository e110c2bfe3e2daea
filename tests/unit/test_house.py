"""The package's shape holds: no import cycle between packages, and no sub-package importing the
modules of a parent that imports it (`scripts/house_report.py` measures both for the closing notes)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _house_report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("house_report", ROOT / "scripts" / "house_report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_cycle_and_no_import_running_back_up() -> None:
    report = _house_report().report(ROOT / "src" / "corral")
    assert report["import_cycles"] == []
    assert report["imports_back_up"] == []


def test_the_report_sees_a_cycle_and_an_import_back_up(tmp_path: Path) -> None:
    # the same measure over a tiny package that has both faults, so the test above cannot pass vacuously
    pkg = tmp_path / "corral"
    for sub in ("", "a", "b", "b/c"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from corral.b import y\n")
    (pkg / "b" / "y.py").write_text("from corral.a import x\nfrom corral.b.c import z\n")
    (pkg / "b" / "c" / "z.py").write_text("from corral.b import y\n")
    report = _house_report().report(pkg)
    assert ["corral.a", "corral.b", "corral.b.c"] in report["import_cycles"]
    assert "corral.b.c.z -> corral.b.y" in report["imports_back_up"]
