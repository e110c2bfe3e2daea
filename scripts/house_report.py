"""Print the shape of the `corral` package: files and lines per package, the largest modules,
package import cycles, imports that run back up into a parent package, and `dict[str, Any]` uses.

    .venv/bin/python scripts/house_report.py [--src src/corral] [--json]

Each directory is one node holding its own modules (not its sub-packages'). An edge P -> Q means
a module of P imports a module of Q at run time (imports under `if TYPE_CHECKING:` do not count).
The modules directly in `corral` are each a node of their own. A cycle is a strongly connected
set of more than one node; an import that runs back up is a module importing from one of its
package's ancestors when that ancestor imports the package (or one below it) too.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path


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


def _runtime_imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.orelse:
                    visit(sub)
                continue
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


def report(src: Path) -> dict[str, object]:
    files = sorted(p for p in src.rglob("*.py") if "__pycache__" not in p.parts)
    modules = {_module_name(src, p): p for p in files}
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
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parent.parent / "src" / "corral")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    data = report(args.src)
    if args.json:
        print(json.dumps(data, indent=2))
        return
    print(f"{'package':32} {'files':>5} {'lines':>6}")
    for name, row in data["packages"].items():  # type: ignore[union-attr]
        print(f"{name:32} {row['files']:>5} {row['lines']:>6}")
    total = data["total"]
    print(f"{'total':32} {total['files']:>5} {total['lines']:>6}")  # type: ignore[index]
    print("largest modules:", ", ".join(f"{r['module']} ({r['lines']})" for r in data["largest"]))  # type: ignore[attr-defined]
    print("import cycles:", len(data["import_cycles"]), data["import_cycles"])  # type: ignore[arg-type]
    print("imports that run back up:", len(data["imports_back_up"]))  # type: ignore[arg-type]
    for line in data["imports_back_up"]:  # type: ignore[attr-defined]
        print("   ", line)
    print("dict[str, Any]:", data["dict_str_any"])


if __name__ == "__main__":
    main()
