"""Placeholder: replaced by the supervisor implementation."""

import click


@click.group()
def supervise() -> None:
    """Supervise one engine."""
