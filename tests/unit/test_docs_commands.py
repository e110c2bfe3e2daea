"""Every `corral ...` command line the README and the guides show parses with the CLI as it is now: the
subcommands exist and every option is one the command takes. (Running them is the tour itself; this
catches a renamed command or option the day it changes.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from corral.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/concepts.md", "docs/kubernetes.md")
_FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _shown_commands() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for page in PAGES:
        for block in _FENCE.findall((ROOT / page).read_text(encoding="utf-8")):
            for line in block.splitlines():
                line = line.removeprefix("$ ").split("  #", 1)[0].split(" > ", 1)[0].strip()
                if not line.startswith("corral ") or re.match(r"^corral [a-z0-9 -]+:", line):
                    continue  # not a command, or a command's own output line ("corral k8s render: wrote ...")
                found.append((page, line))
    return found


def _parse(argv: list[str]) -> None:
    """Find the subcommand the leading words name, then parse its options the way click does, without
    running anything."""
    command: click.Command = main
    parent = click.Context(main, info_name="corral")
    while isinstance(command, click.Group) and argv and not argv[0].startswith("-"):
        sub = command.get_command(parent, argv[0])
        if sub is None:
            raise click.UsageError(f"no such command {argv[0]!r}")
        command, argv = sub, argv[1:]
        parent = click.Context(command, info_name=command.name, parent=parent)
    try:
        command.make_context(command.name, list(argv), parent=parent.parent)
    except click.BadParameter as error:
        # a file the example names (v2.yaml, KEY) need not exist here; any other bad value is a failure
        if "does not exist" not in error.format_message():
            raise


def test_the_pages_show_commands() -> None:
    pages = {page for page, _ in _shown_commands()}
    assert pages == set(PAGES)


@pytest.mark.parametrize(("page", "line"), _shown_commands())
def test_shown_command_parses(page: str, line: str) -> None:
    argv = [token for token in shlex.split(line)[1:] if token != "..."]
    try:
        _parse(argv)
    except click.UsageError as error:
        pytest.fail(f"{page}: `{line}` no longer parses: {error.format_message()}")
