"""Print the shape of the `corral` package: files and lines per package, the largest modules,
package import cycles, imports that run back up into a parent package, `dict[str, Any]` uses, and the
house rules of ARCHITECTURE.md §12 that `tests/unit/test_house.py` holds: imports of a floor above,
imports of the simulator from outside it, and file-level import circles.

    .venv/bin/python scripts/house_report.py [--src src/corral] [--json]

Package cycles: each directory is one node holding its own modules (not its sub-packages'). An edge
P -> Q means a module of P imports a module of Q at run time (imports under `if TYPE_CHECKING:` do not
count). The modules directly in `corral` are each a node of their own. A cycle is a strongly connected
set of more than one node; an import that runs back up is a module importing from one of its package's
ancestors when that ancestor imports the package (or one below it) too.

Floors, the simulator and file circles count every import statement a module holds: at module level,
inside a function, and under `if TYPE_CHECKING:`. An import moved into a function or behind
TYPE_CHECKING still makes the two files one design (neither can be read, moved or tested without the
other); it only keeps the interpreter from tripping over the circle. The floor table is data in
`tests/unit/test_house.py` (`FLOORS`), the one place it is written; this script reads it from there.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import sys
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

SIMULATOR = "corral.sim"
# The top-level CLI dispatches `corral sim` (by name, through importlib); it is the one module outside
# the simulator allowed to name it.
SIMULATOR_DISPATCH = ("corral.cli",)


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package_of(module: str, packages: set[str]) -> str:
    """The node a module belongs to: its package, except that the modules directly in the top
    package (`corral.aio`, `corral.cli`, ...) are each a node of their own: they are the floors
    above and below the sub-packages, not a room."""
    if module in packages:
        return module
    package = module.rsplit(".", 1)[0]
    return module if "." not in package else package


def _imports(tree: ast.Module, module: str, is_package: bool, *, type_checking: bool) -> set[str]:
    """What a module's import statements name (each `from X import y` as both `X` and `X.y`), anywhere
    in it; under `if TYPE_CHECKING:` only when `type_checking`."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.body if type_checking else []:
                    visit_one(sub)
                for sub in child.orelse:
                    visit_one(sub)
                continue
            visit_one(child)

    def visit_one(child: ast.AST) -> None:
        if isinstance(child, ast.Import):
            found.update(alias.name for alias in child.names)
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                anchor = module.split(".")
                drop = child.level - (1 if is_package else 0)
                anchor = anchor[: len(anchor) - drop] if drop else anchor
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in child.names)
        visit(child)

    visit(tree)
    return found


def _runtime_imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    return _imports(tree, module, is_package, type_checking=False)


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[set[str]] = []
    counter = [0]

    def connect(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: set[str] = set()
            while True:
                item = stack.pop()
                on_stack.discard(item)
                group.add(item)
                if item == node:
                    break
            result.append(group)

    sys.setrecursionlimit(10000)
    for node in list(graph):
        if node not in index:
            connect(node)
    return result


def _modules(src: Path) -> dict[str, Path]:
    files = sorted(p for p in src.rglob("*.py") if "__pycache__" not in p.parts)
    return {_module_name(src, p): p for p in files}


def module_imports(src: Path) -> dict[str, set[str]]:
    """Each module of the package, and the package's modules it imports anywhere: at module level,
    inside a function, under `if TYPE_CHECKING:`."""
    modules = _modules(src)
    found: dict[str, set[str]] = {}
    for name, path in modules.items():
        named = _imports(ast.parse(path.read_text()), name, path.name == "__init__.py", type_checking=True)
        targets = {target for target in named if target in modules and target != name}
        # `from corral.x import y` names the package corral.x too; where y is a module, y is the import
        found[name] = {t for t in targets if not any(o.startswith(t + ".") for o in targets)}
    return found


def floor_of(module: str, floors: Mapping[str, int]) -> int | None:
    """A module's floor: the row of `floors` that names it most closely. A row names a package (its
    modules and sub-packages'), a module, or with `.*` the modules directly in a package."""
    best: tuple[int, int] | None = None
    for key, floor in floors.items():
        if key.endswith(".*"):
            parent = key[:-2]
            hit = module == parent or (
                module.startswith(parent + ".") and "." not in module[len(parent) + 1 :]
            )
        else:
            hit = module == key or module.startswith(key + ".")
        if hit and (best is None or len(key) > best[0]):
            best = (len(key), floor)
    return None if best is None else best[1]


def floor_violations(src: Path, floors: Mapping[str, int]) -> list[str]:
    """`a -> b` for each import of a module on a floor above the importer's."""
    found: list[str] = []
    for module, targets in sorted(module_imports(src).items()):
        own = floor_of(module, floors)
        for target in sorted(targets):
            theirs = floor_of(target, floors)
            if own is not None and theirs is not None and theirs > own:
                found.append(f"{module} -> {target}")
    return found


def simulator_imports(src: Path) -> list[str]:
    """`a -> b` for each import of the simulator by a module outside it (the dispatching CLI aside)."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in module_imports(src).items()
        if not (module == SIMULATOR or module.startswith(SIMULATOR + "."))
        and module not in SIMULATOR_DISPATCH
        for target in targets
        if target == SIMULATOR or target.startswith(SIMULATOR + ".")
    )


def file_circles(src: Path) -> list[list[str]]:
    """Sets of modules that import each other, directly or through a chain (each sorted)."""
    graph = module_imports(src)
    return sorted(sorted(group) for group in _strongly_connected(graph) if len(group) > 1)


def floors_table(root: Path) -> dict[str, int]:
    """`FLOORS` of `tests/unit/test_house.py`: the floor table, written there once."""
    spec = importlib.util.spec_from_file_location("test_house", root / "tests" / "unit" / "test_house.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.FLOORS)


def report(src: Path, floors: Mapping[str, int] | None = None) -> dict[str, object]:
    modules = _modules(src)
    files = list(modules.values())
    packages = {_module_name(src, p) for p in files if p.name == "__init__.py"}
    per_package: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    sizes: list[tuple[int, str]] = []
    dict_any = 0
    graph: dict[str, set[str]] = defaultdict(set)
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for name, path in modules.items():
        text = path.read_text()
        lines = text.count("\n")
        package = _package_of(name, packages) if path.name != "__init__.py" else name
        per_package[package][0] += 1
        per_package[package][1] += lines
        sizes.append((lines, str(path.relative_to(src.parent))))
        dict_any += text.count("dict[str, Any]")
        tree = ast.parse(text)
        for target in _runtime_imports(tree, name, path.name == "__init__.py"):
            if target not in modules:
                continue
            other = _package_of(target, packages) if modules[target].name != "__init__.py" else target
            if other != package:
                graph[package].add(other)
                edges[(package, other)].add(f"{name} -> {target}")
    cycles = [sorted(group) for group in _strongly_connected(graph) if len(group) > 1]
    back_up = sorted(
        line
        for (package, other), lines in edges.items()
        if package.startswith(other + ".")
        and any(q == package or q.startswith(package + ".") for q in graph.get(other, set()))
        for line in lines
    )
    sizes.sort(reverse=True)
    return {
        "packages": {k: {"files": v[0], "lines": v[1]} for k, v in sorted(per_package.items())},
        "total": {"files": len(files), "lines": sum(v[1] for v in per_package.values())},
        "largest": [{"module": m, "lines": n} for n, m in sizes[:5]],
        "import_cycles": cycles,
        "imports_back_up": back_up,
        "dict_str_any": dict_any,
        "floor_violations": floor_violations(src, floors) if floors is not None else None,
        "simulator_imports": simulator_imports(src),
        "file_circles": file_circles(src),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parent.parent / "src" / "corral")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    data = report(args.src, floors_table(Path(__file__).resolve().parent.parent))
    if args.json:
        print(json.dumps(data, indent=2))
        return
    print(f"{'package':32} {'files':>5} {'lines':>6}")
    for name, row in data["packages"].items():  # type: ignore[attr-defined]
        print(f"{name:32} {row['files']:>5} {row['lines']:>6}")
    total = data["total"]
    print(f"{'total':32} {total['files']:>5} {total['lines']:>6}")  # type: ignore[index]
    print("largest modules:", ", ".join(f"{r['module']} ({r['lines']})" for r in data["largest"]))  # type: ignore[attr-defined]
    print("import cycles:", len(data["import_cycles"]), data["import_cycles"])  # type: ignore[arg-type]
    print("imports that run back up:", len(data["imports_back_up"]))  # type: ignore[arg-type]
    for line in data["imports_back_up"]:  # type: ignore[attr-defined]
        print("   ", line)
    print("dict[str, Any]:", data["dict_str_any"])
    for key, title in (
        ("floor_violations", "imports of a floor above"),
        ("simulator_imports", "imports of the simulator from outside it"),
        ("file_circles", "file-level import circles"),
    ):
        print(f"{title}:", len(data[key]))  # type: ignore[arg-type]
        for line in data[key]:  # type: ignore[attr-defined]
            print("   ", line)


if __name__ == "__main__":
    main()
