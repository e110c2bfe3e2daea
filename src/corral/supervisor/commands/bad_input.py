"""How `corral supervise` refuses its input: one line on stderr and exit code 2, before anything is
started; and the management token, read that way. The flags (`supervisor/cli.py`) and what checks
them (`supervisor/start.py`) both refuse with it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from corral.supervisor_tokens import TokenFileError, read_management_token


def bad_input(message: str) -> NoReturn:
    click.echo(f"corral supervise: {message}", err=True)
    sys.exit(2)


def read_token(token_file: Path | None) -> str | None:
    """The management token from `token_file`, else from $CORRAL_TOKEN; exits 2 if the file is unusable."""
    try:
        return read_management_token(token_file)
    except TokenFileError as exc:
        bad_input(str(exc))
