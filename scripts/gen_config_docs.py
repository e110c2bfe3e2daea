#!/usr/bin/env python3
"""Write docs/corral-yaml.md, the `corral.yaml` reference, from the pydantic model `corral k8s render`
reads (corral.k8s.render.config.CorralDeployment): every key, its type, default and description.

tests/unit/test_config_docs.py regenerates the page and fails when the committed one differs.

    .venv/bin/python scripts/gen_config_docs.py           # rewrite docs/corral-yaml.md
    .venv/bin/python scripts/gen_config_docs.py --check   # exit 1 if docs/corral-yaml.md is stale
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from corral.k8s.render.config import CorralDeployment

PAGE = Path(__file__).resolve().parent.parent / "docs" / "corral-yaml.md"

_HEADER = """# corral.yaml reference

Every key of the `corral.yaml` that `corral k8s render --config FILE` reads, with its type, default and
meaning. Keys without a default are required. Unknown keys are refused, naming the key. This page is
generated from the configuration model: do not edit it; run `.venv/bin/python scripts/gen_config_docs.py`
after changing the model (a unit test fails while it is stale).

How to use it: [the Kubernetes guide](kubernetes.md). Smallest example:
[deploy/examples/minimal/corral.yaml](../deploy/examples/minimal/corral.yaml).
"""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The configuration sections an annotation holds (itself, or inside Optional, list or dict)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(
        annotation, getattr(annotation, "__name__", str(annotation))
    )


def _default(info: FieldInfo) -> str:
    if info.default is PydanticUndefined:
        if info.default_factory is None:
            return "required"
        made = info.default_factory()  # type: ignore[call-arg]
        if isinstance(made, BaseModel):
            return "default: all defaults"
        return f"default: `{made!r}`" if made not in ([], {}) else "default: empty"
    if info.default is None:
        return "default: null"
    if isinstance(info.default, bool):
        return f"default: `{str(info.default).lower()}`"
    return f"default: `{info.default}`"


def _section(model: type[BaseModel], path: str, lines: list[str], seen: set[str]) -> None:
    nested: list[tuple[str, type[BaseModel]]] = []
    lines += [f"## {path}" if path else "## Top level", ""]
    doc = (model.__doc__ or "").strip()
    if doc and model is not CorralDeployment:
        lines += [" ".join(doc.split()), ""]
    for name, info in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        description = " ".join((info.description or "").split())
        entry = f"- `{name}` ({_type_name(info.annotation)}; {_default(info)})"
        lines.append(f"{entry}: {description}" if description else entry)
        for sub in _models_in(info.annotation):
            nested.append((key, sub))
    lines.append("")
    for key, sub in nested:
        if key not in seen:
            seen.add(key)
            _section(sub, key, lines, seen)


def render() -> str:
    """The whole page, as it should be committed."""
    lines = [_HEADER]
    _section(CorralDeployment, "", lines, set())
    return "\n".join(lines).rstrip() + "\n"


def run(argv: list[str]) -> int:
    from generated_page import write_or_check  # beside this script (its directory is on sys.path)

    return write_or_check(PAGE, render(), argv, "scripts/gen_config_docs.py")


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
