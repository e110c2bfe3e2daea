"""`corral logs --engine NAME`: the log of one engine of a local fleet (its supervisor's lines and the
engine's own, as `corral up` keeps them), found by name; its last lines, or followed with `--follow`."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

import click


def _tail(path: Path, lines: int) -> tuple[list[str], int]:
    """The last `lines` lines of `path` and the offset its end was at."""
    with path.open("rb") as fh:
        last = deque((raw.decode(errors="replace").rstrip("\n") for raw in fh), maxlen=lines)
        return list(last), fh.tell()


def _follow(path: Path, offset: int) -> None:
    """Print what is appended to `path` from `offset` on, until Ctrl-C."""
    with path.open("rb") as fh:
        fh.seek(offset)
        pending = b""
        while True:
            chunk = fh.read(65536)
            if not chunk:
                time.sleep(0.25)
                continue
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                click.echo(raw.decode(errors="replace"))


@click.command()
@click.option(
    "--engine", required=True, metavar="NAME", help="The engine, by name (`corral status` lists them)."
)
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Router port of the local fleet.",
)
@click.option(
    "--lines", "-n", default=50, show_default=True, type=click.IntRange(min=0), help="Lines to show."
)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until Ctrl-C.")
def logs(engine: str, port: int, lines: int, follow: bool) -> None:
    """Show an engine's log in a local fleet (`corral up`): its supervisor's lines and the engine's."""
    from corral.aio import run  # here, not above: `--help` starts without aiohttp
    from corral.clients.engine_names import EngineNameError, find_engine

    try:
        member = run(find_engine(port, engine))
    except EngineNameError as exc:
        raise click.UsageError(str(exc)) from None
    path = Path(member.log)
    try:
        shown, end = _tail(path, lines)
    except OSError as exc:
        raise click.ClickException(f"cannot read {engine}'s log {path}: {exc.strerror or exc}") from None
    for line in shown:
        click.echo(line)
    if follow:
        try:
            _follow(path, end)
        except KeyboardInterrupt:
            pass
