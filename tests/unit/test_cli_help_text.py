"""Every `corral` command says what it does, and every option it takes says what it means."""

from __future__ import annotations

from collections.abc import Iterator

import click

from corral.cli import main


def _walk(
    command: click.Command, path: tuple[str, ...], parent: click.Context | None
) -> Iterator[tuple[str, click.Command]]:
    # a real Context, so the lazy group imports each subcommand as `corral <name>` would
    ctx = click.Context(command, info_name=path[-1], parent=parent)
    yield " ".join(path), command
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, f"{' '.join(path)} lists {name!r} but cannot load it"
            if not sub.hidden:
                yield from _walk(sub, (*path, name), ctx)


def _commands() -> list[tuple[str, click.Command]]:
    return list(_walk(main, ("corral",), None))


def test_the_walk_reaches_nested_lazy_subcommands() -> None:
    paths = {path for path, _ in _commands()}
    for expected in ("corral sleep", "corral lora load", "corral supervise run", "corral sim preload"):
        assert expected in paths, expected


def test_every_option_has_help() -> None:
    missing = [
        f"{path} {'/'.join(param.opts)}"
        for path, command in _commands()
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip()
    ]
    assert not missing, "options without help text:\n  " + "\n  ".join(missing)


def test_every_command_has_a_short_help() -> None:
    missing = [
        path for path, command in _commands() if not (command.get_short_help_str(limit=200) or "").strip()
    ]
    assert not missing, "commands without help text:\n  " + "\n  ".join(missing)
