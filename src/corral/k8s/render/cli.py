"""`corral k8s render --config corral.yaml [--out DIR] [--explain]`. A bad config is a list of problems
on stderr (field, value, what to do) and exit code 2; nothing is written.

The config model, the budgets and the manifests (pydantic, the Grafana SDK) are imported when the
command runs, so that `--help` starts fast."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from corral.k8s.render.budgets import Step


@click.group(name="k8s", context_settings={"help_option_names": ["-h", "--help"]})
def k8s() -> None:
    """Kubernetes manifests where Kubernetes schedules and Corral runs the lifecycle."""


def _explain(steps: tuple[Step, ...]) -> None:
    width = max(len(s.name) for s in steps)
    for step in steps:
        value = f"{step.value:.1f}" if step.value != int(step.value) else str(int(step.value))
        click.echo(f"  {step.name:<{width}}  {value:>8}  = {step.formula}", err=True)


@k8s.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The deployment's corral.yaml.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write one YAML file per object here (default: one stream on stdout).",
)
@click.option("--explain", is_flag=True, help="Show how every probe, drain and rollout number was computed.")
def render(config_path: Path, out: Path | None, explain: bool) -> None:
    """Render the engine Deployment (supervisor entrypoint, probes, preStop drain; engine on loopback
    behind the admission gate; restricted securityContext; a token per pod), its Service,
    PodDisruptionBudget and NetworkPolicy, and the router with its RBAC and Service."""
    from corral.k8s.render.budgets import derive
    from corral.k8s.render.config_reading import ConfigError, load_config
    from corral.k8s.render.kv_events_plan import decisions, replicas_apart
    from corral.k8s.render.manifests import render as render_manifests
    from corral.k8s.render.output import admin_secret_hint, secret_hint, stream, write_dir
    from corral.k8s.render.pd_objects import explain as pd_explain

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        click.echo(f"corral k8s render: {exc}", err=True)
        sys.exit(2)
    budgets = derive(config)
    manifests = render_manifests(config, budgets)
    steps, warnings = (budgets.steps, budgets.warnings) if config.pd is None else pd_explain(config, budgets)
    apart = replicas_apart(config)
    for warning in [*warnings, *([apart] if apart is not None else [])]:
        click.echo(f"corral k8s render: warning: {warning}", err=True)
    for decision in decisions(config).values():  # also on each engine Deployment, as an annotation
        click.echo(f"corral k8s render: KV events for {decision.group}: {decision.text()}", err=True)
    if explain:
        click.echo(f"corral k8s render: numbers for {config.name}:", err=True)
        _explain(steps)
    if out is None:
        click.echo(stream(config, manifests), nl=False)
        return
    written = write_dir(out, config, manifests)
    click.echo(f"corral k8s render: wrote {len(written)} objects to {out}", err=True)
    click.echo(f"corral k8s render: create the fleet key Secret first: {secret_hint(config)}", err=True)
    click.echo(
        f"corral k8s render: and the router's admin key Secret (/metrics, /v1/fleet): "
        f"{admin_secret_hint(config)}",
        err=True,
    )
