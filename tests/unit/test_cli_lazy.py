"""`corral`'s subcommands are imported only when they run: `corral --help` and `corral status --help`
load no HTTP client, no pydantic models and no router; every command's `--help`, nested ones too, loads
none of the heavy libraries (what it runs is imported when it runs); and every listed subcommand loads
as itself."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from corral.cli import SUBCOMMANDS, main

HEAVY = ("aiohttp", "pydantic", "corral.router", "corral.sim", "corral.supervisor", "rich")


def modules_after(*args: str) -> set[str]:
    """The modules a fresh interpreter holds after `corral ARGS` ran (its help printed)."""
    code = (
        "import sys\n"
        "from corral.cli import main\n"
        "try:\n"
        f"    main({list(args)!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('\\n'.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    argv = [sys.executable, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    return set(done.stderr.split())


@pytest.mark.parametrize("args", [("--help",), ("status", "--help")])
def test_help_imports_nothing_heavy(args: tuple[str, ...]) -> None:
    loaded = modules_after(*args)
    assert "corral.cli" in loaded
    assert not [m for m in loaded if m.split(".")[0] in HEAVY or m.startswith(HEAVY)]


# What no `--help` may load: each costs tens of milliseconds or more of start-up.
HEAVY_LIBRARIES = (
    "aiohttp",
    "pydantic",
    "rich",
    "yaml",
    "prometheus_client",
    "kubernetes_asyncio",
    "uvloop",
    "psutil",
    "zmq",
    "grafana_foundation_sdk",
)


def command_paths() -> list[tuple[str, ...]]:
    """Every command under `corral`, nested groups' commands included."""
    paths: list[tuple[str, ...]] = []

    def walk(command: click.Command, path: tuple[str, ...]) -> None:
        paths.append(path)
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, (path, name)
                walk(sub, (*path, name))

    walk(main, ())
    return paths


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "corral")
def test_no_help_loads_a_heavy_library(path: tuple[str, ...]) -> None:
    heavy = sorted({m.split(".")[0] for m in modules_after(*path, "--help")} & set(HEAVY_LIBRARIES))
    assert heavy == [], f"`corral {' '.join(path)} --help` loads {', '.join(heavy)}"


def test_every_listed_subcommand_loads_as_itself() -> None:
    for name, sub in SUBCOMMANDS.items():
        command = sub.load()
        assert isinstance(command, click.Command) and command.name == name, sub.where
    ctx = click.Context(main)
    assert main.list_commands(ctx) == list(SUBCOMMANDS)
    assert main.get_command(ctx, "no-such-command") is None
