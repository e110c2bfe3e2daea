"""The simulator's rooms import downwards only: core imports neither http, weights nor the top modules;
weights imports no http; no room imports sim/server.py or sim/cli.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import corral.sim

SIM = Path(corral.sim.__file__).parent
TOP = ("corral.sim.server", "corral.sim.cli")
FORBIDDEN = {
    "core": ("corral.sim.http", "corral.sim.weights", *TOP),
    "weights": ("corral.sim.http", *TOP),
    "http": TOP,
}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_a_room_imports_nothing_above_it(room: str) -> None:
    files = sorted((SIM / room).glob("*.py"))
    assert files
    upward = [
        f"{path.name} -> {name}"
        for path in files
        for name in sorted(_imports(path))
        if any(name == up or name.startswith(up + ".") for up in FORBIDDEN[room])
    ]
    assert upward == []
