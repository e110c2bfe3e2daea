"""`corral up`: a local fleet of simulated engines behind a router, started with one command. This
module holds its flags; what starts the fleet is corral.fleet.local.up_run, imported when the command
runs, so that `corral up --help` starts fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from corral.policy_names import POLICY_NAMES


@click.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A fleet.yaml describing the fleet (docs/fleet-yaml.md); a flag given on the command line "
    "overrides the file's value.",
)
@click.option(
    "--engines",
    "-n",
    default=None,
    type=click.IntRange(1, 64),
    help="Number of simulated engines, each doing prefill and decode [default: 2].",
)
@click.option(
    "--prefill",
    default=0,
    type=click.IntRange(0, 64),
    help="A disaggregated fleet: this many prefill engines (with --decode; not with --engines).",
)
@click.option(
    "--decode",
    default=0,
    type=click.IntRange(0, 64),
    help="A disaggregated fleet: this many decode engines (with --prefill; not with --engines).",
)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="Router port.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address everything binds.")
@click.option("--model", default="sim-model", show_default=True, help="Model name the engines serve.")
@click.option(
    "--policy",
    default="least_request",
    show_default=True,
    type=click.Choice(POLICY_NAMES),  # a local fleet offers every router policy
    help="How the router picks an engine. `prefix` also routes by the engines' own KV-cache events "
    "(published on sockets in the log directory).",
)
@click.option(
    "--startup-timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Seconds each member may take to answer before `up` gives up.",
)
@click.option(
    "--stop-grace",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds each member gets to exit after SIGTERM (a supervisor drains first) before it is killed.",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where each member's log goes (default: a new temporary directory).",
)
@click.option(
    "--group-size",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Engines per serving group: a group is started and retired whole (by `corral rollout`), "
    "so it never mixes bundles. --engines must be a multiple of it.",
)
@click.option(
    "--bundle",
    "bundle_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Bundle file (name, engine_args, env, fingerprint) the engines start from; a fingerprint is "
    "every supervisor's --expect-fingerprint. Default: a bundle named 'initial' made of the --sim-arg's.",
)
@click.option(
    "--drain-timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Every supervisor's drain deadline (`corral supervise --drain-timeout`): in-flight requests "
    "still running after it are cut, and the admission gate names them.",
)
@click.option(
    "--no-gate",
    is_flag=True,
    help="Route straight to the engines instead of through each supervisor's admission gate (which "
    "names the requests a drain's deadline cuts); the engines then listen on --host.",
)
@click.option(
    "--no-sleep-mode",
    is_flag=True,
    help="Start the simulators without sleep mode and development endpoints (then `corral sleep`, "
    "`wake` and `reload` refuse). By default they have both, the endpoints reachable only through "
    "each supervisor (behind its gate, or on a loopback --host).",
)
@click.option(
    "--preload",
    is_flag=True,
    help="Give each engine its own weight-cache daemon (`corral sim preload` on the bundle's "
    "--version-string, under its supervisor) and load its weights from it (ipc_cache, zero_copy; no "
    "sleep mode). A rollout's new groups start new daemons; retired groups stop theirs.",
)
@click.option("--verbose", "-v", is_flag=True, help="Also print every member's log lines.")
@click.option(
    "--sim-arg",
    "sim_args",
    multiple=True,
    help="Extra argument passed to every `corral sim` (repeatable), e.g. --sim-arg=--itl-ms=5.",
)
@click.option(
    "--router-arg",
    "router_args",
    multiple=True,
    help="Extra argument passed to the `corral router` (repeatable), e.g. "
    "--router-arg=--slow-start-seconds=10.",
)
def up(**flags: Any) -> None:
    """Start a local fleet: simulated engines and a router on loopback, until Ctrl-C."""
    from corral.fleet.local.up_run import up_fleet

    up_fleet(**flags)
