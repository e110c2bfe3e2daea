"""`corral router`: its flags. What parses them into the router's configuration and runs it (aiohttp,
uvloop, membership and routing) is corral.router.start, imported when the command runs, so that
`corral router --help` starts fast."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from corral.policy_names import POLICY_NAMES
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
@click.option(
    "--backend",
    "backends",
    multiple=True,
    help="Engine base URL, e.g. http://127.0.0.1:9001 (repeat for each engine). Discovery `static`.",
)
@click.option(
    "--prefill",
    "prefill",
    multiple=True,
    metavar="URL",
    help="A prefill engine for prefill/decode disaggregation (repeatable; as vllm-router's "
    "--vllm-pd-disaggregation --prefill). Its supervisor's role, when it has one, wins. Discovery `static`.",
)
@click.option(
    "--decode",
    "decode",
    multiple=True,
    metavar="URL",
    help="A decode engine for prefill/decode disaggregation (repeatable; as vllm-router's --decode).",
)
@click.option(
    "--supervised",
    "supervised",
    multiple=True,
    metavar="ENGINE_URL=SUPERVISOR_URL",
    help="An engine run under `corral supervise`: routed only while its supervisor's state stream says "
    "READY, and each removal is acknowledged to the supervisor (repeatable; mixes with --backend).",
)
@click.option(
    "--supervisor-port",
    type=click.IntRange(1, 65535),
    help="k8s: every pod's supervisor port on the pod IP (a pod's corral.dev/supervisor-port "
    "annotation takes precedence).",
)
@click.option(
    "--supervisor-token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Bearer token for the supervisors' management API (else $CORRAL_TOKEN).",
)
@click.option(
    "--supervisor-token-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="k8s: the fleet key; each pod's supervisor token is derived from it and the pod's "
    "namespace/name (as `corral supervise derive-token` does), so no one token opens every supervisor.",
)
@click.option(
    "--router-id",
    help="This router replica's name in the supervisors' subscriptions and acknowledgements "
    "(default: HOSTNAME-PID).",
)
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
    "--supervisor-heartbeat",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0.2, max=60),
    help="Heartbeat interval asked of each supervisor stream; 3 missed make the stream stale and the "
    "endpoint unroutable until it is back.",
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
    "--carry-adapters-seconds",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0.0),
    help="Hold each engine that joins (followed through its supervisor) out of routing until the LoRA "
    "adapters the fleet's other supervisors desire (--lora and runtime loads) are loaded there through "
    "its supervisor, at most this long; then route it with what it has (0: off). For Kubernetes, where "
    "a new pod knows only corral.yaml's adapters.",
)
@click.option(
    "--backends-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="File with one engine per line (URL, or ENGINE_URL=SUPERVISOR_URL, optionally followed by "
    "group=NAME/SIZE for a member of a serving group, routed only whole, and role=prefill|decode|both), "
    "read again whenever it changes. Discovery `file`.",
)
@click.option(
    "--discovery",
    type=click.Choice(["static", "file", "k8s"]),
    help="Where membership comes from; by default `file` with --backends-file, else `static`.",
)
@click.option("--namespace", help="k8s: namespace of the engine pods.")
@click.option("--selector", help="k8s: label selector of the engine pods, e.g. app=vllm.")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, exists=True),
    help="k8s: kubeconfig file; without it the pod's in-cluster service account is used.",
)
@click.option("--engine-port", default=8000, show_default=True, type=int, help="k8s: the engines' port.")
@click.option(
    "--k8s-resync-seconds",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="k8s: full re-list this often, removing pods whose DELETE was missed.",
)
@click.option(
    "--k8s-watch-timeout",
    default=300,
    show_default=True,
    type=click.IntRange(min=1),
    help="k8s: timeoutSeconds asked of each watch request.",
)
@click.option(
    "--probe-timeout",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds one engine's /v1/models may take before it counts as not answering.",
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
@click.option(
    "--policy",
    type=click.Choice(POLICY_NAMES),
    default="round_robin",
    show_default=True,
    help="Default routing policy: round_robin (in turn), least_request (the less busy of two sampled), "
    "session (sticky by --session-header), prefix (where the prompt's prefix is cached, bounded by load), "
    "load (the engines' queue, in flight and KV use). --policy-config sets one per model.",
)
@click.option(
    "--session-header",
    default="x-session-id",
    show_default=True,
    help="Header whose value keys session affinity (policy `session`).",
)
@click.option(
    "--policy-config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="YAML/JSON file: policy per model, scored policies' weights, load bound, prefix blocks, "
    "metrics scrape interval (see corral.router.routing.config). Its `policy` overrides --policy.",
)
@click.option(
    "--tokenizer",
    help="How the engines tokenize prompts: `sim` for `corral sim` engines, or a model directory or name "
    "(needs the optional `transformers` package). With it, prefix routing (policies `prefix`, `load`) "
    "reads the KV-cache events of every engine that publishes them (--kv-events-config; address from its "
    "supervisor, the backends file's kv_events=, the pod annotation corral.dev/kv-events) and routes by "
    "the longest prefix each engine holds; without it, or for engines without events, by approximate "
    "prefix memory.",
)
@click.option(
    "--slow-start-seconds",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0, max=3600),
    help="An endpoint that becomes routable (READY, woken, restarted, back from an ejection, a new "
    "group) takes a share of traffic rising from 10%% of its full share to all of it over this many "
    "seconds, in every policy. 0 turns it off; per model: `slow_start_*` in --policy-config.",
)
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
    "--models-refresh-seconds",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="How often each backend's /v1/models is asked (in the background).",
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
