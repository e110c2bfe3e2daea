"""Placeholder: replaced by the `corral up` implementation."""

import click


@click.command()
def up() -> None:
    """Start a local fleet."""
    raise click.ClickException("not built yet")
