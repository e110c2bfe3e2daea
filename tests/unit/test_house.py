"""The package's shape holds the house rules of ARCHITECTURE.md §12: no import cycle between packages, no
sub-package importing the modules of a parent that imports it, no package importing one on a floor above
it, nothing outside the simulator importing it (the top-level CLI dispatches `corral sim` by name), and no
two files importing each other, directly or through a chain (`scripts/house_report.py` measures each and
prints them for the closing notes).

For floors, the simulator and file circles every import statement counts: at module level, inside a
function, and under `if TYPE_CHECKING:`. Moving an import into a function or behind TYPE_CHECKING keeps
the interpreter from tripping over a circle, not the two files from being one design."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]

# ARCHITECTURE.md §12's floor table, the one place it is written as data (`scripts/house_report.py`
# reads it from here). A module imports only modules on its own floor or below. A row names a package
# (with its sub-packages), a module, or with `.*` the modules directly in a package; the closest row wins.
FLOORS: dict[str, int] = {
    "corral.*": 0,  # shared vocabulary: engine_state, redaction, atomic_file, ...
    "corral.contracts": 0,
    "corral.engine": 0,
    "corral.clients": 1,
    "corral.tracing": 1,  # OpenTelemetry export, shared by the router, supervisor and rollout
    "corral.sim": 2,
    "corral.k8s": 2,
    "corral.router": 3,
    "corral.supervisor": 3,
    "corral.fleet": 4,
    "corral.epp": 4,  # the endpoint picker: the router's core behind ext_proc (a second front door)
    "corral.cli": 5,  # the top composition root: dispatches every subcommand
    "corral.__main__": 5,
}

# The only exemptions: violations whose fix needs a file another engineer is editing right now. Each
# names why, and is to be removed (with the violation) once that edit has landed; the tests below fail
# when a listed violation is gone, so a stale entry cannot stay.
KNOWN_FLOOR_VIOLATIONS: dict[str, str] = {}
KNOWN_SIMULATOR_IMPORTS: dict[str, str] = {}
KNOWN_FILE_CIRCLES: dict[tuple[str, ...], str] = {}


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


def test_every_module_stands_on_a_floor() -> None:
    house = _house_report()
    unplaced = [m for m in house.module_imports(ROOT / "src" / "corral") if house.floor_of(m, FLOORS) is None]
    assert unplaced == [], "add a row to FLOORS (and to ARCHITECTURE.md §12's table)"


def test_no_package_imports_a_floor_above_it() -> None:
    found = _house_report().floor_violations(ROOT / "src" / "corral", FLOORS)
    assert found == sorted(KNOWN_FLOOR_VIOLATIONS)


def test_nothing_outside_the_simulator_imports_it() -> None:
    found = _house_report().simulator_imports(ROOT / "src" / "corral")
    assert found == sorted(KNOWN_SIMULATOR_IMPORTS)


def test_no_two_files_import_each_other() -> None:
    found = _house_report().file_circles(ROOT / "src" / "corral")
    assert found == sorted(list(circle) for circle in KNOWN_FILE_CIRCLES)


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


def test_the_report_sees_a_floor_above_the_simulator_and_a_hidden_circle(tmp_path: Path) -> None:
    # a tiny package with each fault, its imports hidden in a function or behind TYPE_CHECKING
    pkg = tmp_path / "corral"
    for sub in ("", "low", "high", "sim"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("from corral.sim import engine\n")
    (pkg / "sim" / "engine.py").write_text("X = 1\n")
    (pkg / "low" / "base.py").write_text("def up() -> None:\n    from corral.high import top\n")
    (pkg / "high" / "top.py").write_text("from corral.sim.engine import X\nfrom corral.high import peer\n")
    (pkg / "high" / "peer.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from corral.high.top import T\n"
    )
    house = _house_report()
    floors = {"corral.*": 0, "corral.low": 0, "corral.sim": 1, "corral.high": 2, "corral.cli": 3}
    assert house.floor_violations(pkg, floors) == ["corral.low.base -> corral.high.top"]
    assert house.simulator_imports(pkg) == ["corral.high.top -> corral.sim.engine"]
    assert house.file_circles(pkg) == [["corral.high.peer", "corral.high.top"]]
    assert house.floor_of("corral.cli", floors) == 3 and house.floor_of("corral.high.top", floors) == 2
    assert house.floor_of("corral.aio", floors) == 0 and house.floor_of("corral.other.x", floors) is None
