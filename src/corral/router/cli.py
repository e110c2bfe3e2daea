"""Placeholder: replaced by the router implementation."""

import click


@click.command()
def router() -> None:
    """Run the OpenAI-compatible router."""
    raise click.ClickException("not built yet")
