#!/usr/bin/env python3
"""Write docs/cli.md, the command-line reference, from the click commands themselves.

Walks `corral` and every subcommand (nested groups included) and prints each one's usage, help and
options exactly as `--help` shows them at a fixed width, so the page cannot drift from the code:
tests/unit/test_cli_docs.py regenerates it and fails when the committed page differs.

    .venv/bin/python scripts/gen_cli_docs.py           # rewrite docs/cli.md
    .venv/bin/python scripts/gen_cli_docs.py --check   # exit 1 if docs/cli.md is stale
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import click

from corral.cli import main

WIDTH = 100
PAGE = Path(__file__).resolve().parent.parent / "docs" / "cli.md"

_HEADER = """# Command-line reference

Every `corral` command with its usage, help and options, as `corral ... --help` prints them.
This page is generated: do not edit it; run `.venv/bin/python scripts/gen_cli_docs.py` after changing a
command (a unit test fails while it is stale). For what the commands are for, start with
[the README](../README.md) and [concepts](concepts.md).
"""


def _walk(
    command: click.Command, path: list[str], parent: click.Context | None
) -> Iterator[tuple[list[str], click.Context]]:
    # click >= 8.1.8 caches a command's help option, named by the first context that asked for it: a
    # context made without the parent's settings (a test parsing a subcommand alone) would leave
    # `--help` without `-h` for this page. Forget it, so the page shows what `corral ... --help` shows.
    if getattr(command, "_help_option", None) is not None:
        setattr(command, "_help_option", None)  # noqa: B010 (a private click attribute, by name)
    # the command's own context settings (`-h` beside `--help`), as `make_context` applies them
    settings = {"max_content_width": WIDTH, "terminal_width": WIDTH, **command.context_settings}
    ctx = click.Context(command, info_name=path[-1], parent=parent, **settings)
    yield path, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, [*path, name], ctx)


def render() -> str:
    """The whole page, as it should be committed."""
    entries = list(_walk(main, ["corral"], None))
    lines = [_HEADER, "## Commands", ""]
    for path, _ctx in entries:
        name = " ".join(path)
        anchor = "-".join(path)
        lines.append(f"{'  ' * (len(path) - 1)}- [`{name}`](#{anchor})")
    lines.append("")
    for path, ctx in entries:
        lines += [f"## {' '.join(path)}", "", "```text", ctx.command.get_help(ctx).rstrip(), "```", ""]
    return "\n".join(lines)


def run(argv: list[str]) -> int:
    from generated_page import write_or_check  # beside this script (its directory is on sys.path)

    return write_or_check(PAGE, render(), argv, "scripts/gen_cli_docs.py")


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
