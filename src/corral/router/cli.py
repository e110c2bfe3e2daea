"""`corral router`: its flags. What parses them into the router's configuration and runs it (aiohttp,
uvloop, membership and routing) is corral.router.start, imported when the command runs, so that
`corral router --help` starts fast."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from corral.router.core_options import membership_options, policy_options
from corral.router.edge.access_options import access_options
from corral.router.edge.client_limit_flags import client_limit_options
from corral.router.flow.flags import flow_options
from corral.tracing.flag import otlp_traces_option

DEFAULT_HTTP_SERVER = "lean"  # --http-server: corral.router.serving, or aiohttp for every request


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--workers",
    type=click.IntRange(1, 256),
    envvar="CORRAL_ROUTER_WORKERS",
    help="Router processes sharing the port (SO_REUSEPORT), each a replica with its own membership and "
    "the id ROUTER_ID/wK in the supervisors' acknowledgements; a worker that dies is restarted. "
    "Default: the CPUs this process may use (its affinity, capped by a container's CPU limit); "
    "1: one process. Also $CORRAL_ROUTER_WORKERS.",
)
@membership_options  # --backend, --supervised, --discovery k8s ..., --router-id (corral.router.core_options)
@click.option(
    "--peer",
    "peers",
    multiple=True,
    metavar="URL",
    help="A peer router replica's base URL (repeatable): the replicas share their picks (each prompt's "
    "prefix keys and the engine it went to), read every 0.1 s, so that replicas without KV events "
    "place a prefix where another already did. Needs --peer-token-file; off by default.",
)
@click.option(
    "--peer-token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="File with the secret every peer router shares (--peer): asked of each peer that reads this "
    "router's picks (GET /internal/peer-picks), and sent to the peers this router reads.",
)
@click.option(
    "--wake-hold-seconds",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0.0),
    help="Scale from zero: when a model has no routable engine, ask for one (a supervisor's wake of a "
    "SLEEPING engine, else a scale-up signal on /metrics) and hold the request this long for it (0: none "
    "of this; the request gets 503 with Retry-After).",
)
@click.option(
    "--wake-mode",
    type=click.Choice(["hold", "reject"]),
    default="hold",
    show_default=True,
    help="With --wake-hold-seconds: hold each request until an engine is READY (hold), or answer 503 with "
    "Retry-After at once while the engine is still asked for (reject).",
)
@click.option(
    "--wake-hold-max",
    default=1024,
    show_default=True,
    type=click.IntRange(min=1, max=100_000),
    help="With --wake-hold-seconds and --wake-mode hold: requests held per model at most; the next is "
    "answered 503 with Retry-After at once.",
)
@click.option(
    "--retry-budget-ratio",
    default=0.2,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Retries allowed as a fraction of requests over the window.",
)
@click.option(
    "--retry-budget-min",
    default=3,
    show_default=True,
    type=click.IntRange(min=0),
    help="Retries allowed per window on top of the ratio, so a quiet router can still retry.",
)
@policy_options  # --policy, --policy-config, --tokenizer, --slow-start-seconds ...
@click.option(
    "--max-retries",
    default=2,
    show_default=True,
    type=click.IntRange(min=0),
    help="Other endpoints to try when one fails before sending any byte.",
)
@click.option(
    "--eject-seconds",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="How long a failed endpoint is ejected; doubles on each failure in a row.",
)
@click.option(
    "--request-timeout",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds a backend may stay silent (before its first byte: eject and retry elsewhere; "
    "mid-stream: end the stream with an error event). Must exceed the longest non-streamed "
    "generation. 0 turns it off.",
)
@click.option(
    "--http-server",
    type=click.Choice(["lean", "aiohttp"]),
    default=lambda: os.environ.get("CORRAL_ROUTER_HTTP_SERVER", DEFAULT_HTTP_SERVER),
    show_default=DEFAULT_HTTP_SERVER,
    help="The server side of the router: `lean` answers the inference POSTs on its own HTTP/1.1 "
    "protocol (less CPU per request) and hands every other request to aiohttp; `aiohttp` serves all. "
    "The environment variable CORRAL_ROUTER_HTTP_SERVER sets the default.",
)
@click.option(
    "--shutdown-timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds open requests get to finish on SIGTERM/SIGINT.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Level of the router's log lines (stderr).",
)
@otlp_traces_option  # --otlp-traces-endpoint (corral.tracing.flag)
@client_limit_options  # --header-timeout, --body-timeout, --idle-timeout, --max-connections, ...
@flow_options  # --flow-control, --flow-* (corral.router.flow.flags)
@access_options  # --api-keys-file, --admin-key-file, --admin-port, --admin-host, --engine-api-key-file
def router(**flags: Any) -> None:
    """Run the OpenAI-compatible router in front of a fleet of engines."""
    from corral.router.start import start_router

    start_router(**flags)
