"""Placeholder: replaced by the sim implementation."""

import click


@click.command()
def sim() -> None:
    """Run a vLLM-compatible engine simulator."""
    raise click.ClickException("not built yet")
