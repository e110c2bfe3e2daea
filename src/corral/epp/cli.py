"""`corral epp`: its flags. The membership and policy flags are the router's own
(corral.router.core_options); what runs them is corral.epp.start, imported when the command runs."""

from __future__ import annotations

from typing import Any

import click

from corral.router.core_options import membership_options, policy_options
from corral.router.edge.access_options import access_options


@click.command()
@click.option(
    "--grpc-host",
    default="127.0.0.1",
    show_default=True,
    help="Address the ext_proc gRPC service listens on (the gateway's side; 0.0.0.0 in a pod).",
)
@click.option(
    "--grpc-port",
    default=9002,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port of the ext_proc service and of gRPC health (liveness, readiness, "
    "envoy.service.ext_proc.v3.ExternalProcessor); the InferencePool's endpointPickerRef names it.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address of the HTTP port (probes and metrics).",
)
@click.option(
    "--port",
    default=9003,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="HTTP port: /livez and /health (open, for the kubelet), /metrics and /v1/fleet (the router's "
    "admin rule: loopback or --admin-key-file).",
)
@click.option(
    "--fallbacks",
    default=2,
    show_default=True,
    type=click.IntRange(0, 16),
    help="Endpoints listed after the pick in x-gateway-destination-endpoint, least in flight first, for "
    "the gateway's retries.",
)
@click.option(
    "--max-body-bytes",
    default=16 * 1024 * 1024,
    show_default=True,
    type=click.IntRange(1024, 256 * 1024 * 1024),
    help="The largest request body read for a pick; a larger one is answered 413.",
)
@membership_options
@policy_options
@click.option(
    "--shutdown-timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds open exchanges get to finish on SIGTERM/SIGINT.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Level of the picker's log lines (stderr).",
)
@access_options  # --api-keys-file (tenants: 401/429), --admin-key-file, --engine-api-key-file ...
def epp(**flags: Any) -> None:
    """Pick endpoints for a Gateway API inference gateway (ext_proc endpoint picker of an InferencePool)."""
    from corral.epp.start import start_epp

    start_epp(**flags)
