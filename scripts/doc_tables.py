#!/usr/bin/env python3
"""Writes the field tables of docs/fleet-yaml.md and docs/bundle.md from the pydantic models, between
`<!-- fields: NAME -->` and `<!-- /fields -->`; the rest of each page is written by hand.

tests/unit/test_fleet_docs.py renders the tables again and fails when a committed page differs.

    .venv/bin/python scripts/doc_tables.py           # rewrite the tables in both pages
    .venv/bin/python scripts/doc_tables.py --check   # exit 1 if either page is stale
"""

from __future__ import annotations

import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from corral.bundle_spec import BundleSpec
from corral.fleet.local.fleet_config import EnginesConfig, FleetConfig, RouterConfig

ROOT = Path(__file__).resolve().parents[1]
MODELS: dict[str, type[BaseModel]] = {
    "fleet": FleetConfig,
    "engines": EnginesConfig,
    "router": RouterConfig,
    "bundle": BundleSpec,
}
DOCS = (ROOT / "docs" / "fleet-yaml.md", ROOT / "docs" / "bundle.md")
BLOCK = re.compile(r"(<!-- fields: (\w+) -->\n).*?(<!-- /fields -->)", re.S)


_WORDS = {int: "integer", str: "string", float: "number", bool: "true or false", Path: "path"}


def kind(annotation: Any) -> str:
    """A field's type in the words of a YAML file."""
    if annotation in _WORDS:
        return _WORDS[annotation]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping (below)"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (tuple, list):
        return f"list of {kind(args[0])}s"
    if origin is dict:
        return "mapping of strings" if args[1] is str else "mapping"
    if origin in (types.UnionType, typing.Union):
        return " or ".join(kind(a) for a in args if a is not type(None))
    return str(annotation)


def default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        made = field.default_factory()  # type: ignore[call-arg]
        return "(below)" if isinstance(made, BaseModel) else "empty"
    if field.default is None:
        return "none"
    if isinstance(field.default, bool):
        return f"`{str(field.default).lower()}`"
    return "`[]`" if field.default == () else f"`{field.default}`"


def table(model: type[BaseModel]) -> str:
    rows = ["| field | type | default | what it is |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        rows.append(f"| `{name}` | {kind(field.annotation)} | {default(field)} | {field.description or ''} |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + table(MODELS[m.group(2)]) + m.group(3), text)


def run(argv: list[str]) -> int:
    from generated_page import write_or_check  # beside this script (its directory is on sys.path)

    results = [
        write_or_check(doc, render(doc.read_text(encoding="utf-8")), argv, "scripts/doc_tables.py")
        for doc in DOCS
    ]
    return max(results)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
