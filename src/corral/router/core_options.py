"""The flags every front door of the routing core takes (corral.router.core): where membership comes from
and how the supervisors are followed (`membership_options`) and which policy picks (`policy_options`);
corral.router.core_config checks them. `corral router` and `corral epp` both declare them from here, so
the two read the same fleet the same way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from corral.policy_names import POLICY_NAMES

Command = Callable[..., Any]

_MEMBERSHIP: list[Callable[[Command], Command]] = [
    click.option(
        "--backend",
        "backends",
        multiple=True,
        help="Engine base URL, e.g. http://127.0.0.1:9001 (repeat for each engine). Discovery `static`.",
    ),
    click.option(
        "--prefill",
        "prefill",
        multiple=True,
        metavar="URL",
        help="A prefill engine for prefill/decode disaggregation (repeatable; as vllm-router's "
        "--vllm-pd-disaggregation --prefill). Its supervisor's role, when it has one, wins. "
        "Discovery `static`.",
    ),
    click.option(
        "--decode",
        "decode",
        multiple=True,
        metavar="URL",
        help="A decode engine for prefill/decode disaggregation (repeatable; as vllm-router's --decode).",
    ),
    click.option(
        "--supervised",
        "supervised",
        multiple=True,
        metavar="ENGINE_URL=SUPERVISOR_URL",
        help="An engine run under `corral supervise`: routed only while its supervisor's state stream says "
        "READY, and each removal is acknowledged to the supervisor (repeatable; mixes with --backend).",
    ),
    click.option(
        "--supervisor-port",
        type=click.IntRange(1, 65535),
        help="k8s: every pod's supervisor port on the pod IP (a pod's corral.dev/supervisor-port "
        "annotation takes precedence).",
    ),
    click.option(
        "--supervisor-token-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Bearer token for the supervisors' management API (else $CORRAL_TOKEN).",
    ),
    click.option(
        "--supervisor-token-key-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="k8s: the fleet key; each pod's supervisor token is derived from it and the pod's "
        "namespace/name (as `corral supervise derive-token` does), so no one token opens every supervisor.",
    ),
    click.option(
        "--router-id",
        help="This router replica's name in the supervisors' subscriptions and acknowledgements "
        "(default: HOSTNAME-PID).",
    ),
    click.option(
        "--supervisor-heartbeat",
        default=2.0,
        show_default=True,
        type=click.FloatRange(min=0.2, max=60),
        help="Heartbeat interval asked of each supervisor stream; 3 missed make the stream stale and the "
        "endpoint unroutable until it is back.",
    ),
    click.option(
        "--carry-adapters-seconds",
        default=0.0,
        show_default=True,
        type=click.FloatRange(min=0.0),
        help="Hold each engine that joins (followed through its supervisor) out of routing until the LoRA "
        "adapters the fleet's other supervisors desire (--lora and runtime loads) are loaded there through "
        "its supervisor, at most this long; then route it with what it has (0: off). For Kubernetes, where "
        "a new pod knows only corral.yaml's adapters.",
    ),
    click.option(
        "--backends-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="File with one engine per line (URL, or ENGINE_URL=SUPERVISOR_URL, optionally followed by "
        "group=NAME/SIZE for a member of a serving group, routed only whole, and role=prefill|decode|both), "
        "read again whenever it changes. Discovery `file`.",
    ),
    click.option(
        "--discovery",
        type=click.Choice(["static", "file", "k8s"]),
        help="Where membership comes from; by default `file` with --backends-file, else `static`.",
    ),
    click.option("--namespace", help="k8s: namespace of the engine pods."),
    click.option("--selector", help="k8s: label selector of the engine pods, e.g. app=vllm."),
    click.option(
        "--kubeconfig",
        type=click.Path(dir_okay=False, exists=True),
        help="k8s: kubeconfig file; without it the pod's in-cluster service account is used.",
    ),
    click.option("--engine-port", default=8000, show_default=True, type=int, help="k8s: the engines' port."),
    click.option(
        "--k8s-resync-seconds",
        default=60.0,
        show_default=True,
        type=click.FloatRange(min=1),
        help="k8s: full re-list this often, removing pods whose DELETE was missed.",
    ),
    click.option(
        "--k8s-watch-timeout",
        default=300,
        show_default=True,
        type=click.IntRange(min=1),
        help="k8s: timeoutSeconds asked of each watch request.",
    ),
    click.option(
        "--probe-timeout",
        default=2.0,
        show_default=True,
        type=click.FloatRange(min=0.1),
        help="Seconds one engine's /v1/models may take before it counts as not answering.",
    ),
    click.option(
        "--models-refresh-seconds",
        default=5.0,
        show_default=True,
        type=click.FloatRange(min=0.1),
        help="How often each backend's /v1/models is asked (in the background).",
    ),
]

_POLICY: list[Callable[[Command], Command]] = [
    click.option(
        "--policy",
        type=click.Choice(POLICY_NAMES),
        default="round_robin",
        show_default=True,
        help="Default routing policy: round_robin (in turn), least_request (the less busy of two sampled), "
        "session (sticky by --session-header), prefix (where the prompt's prefix is cached, bounded by "
        "load), "
        "load (the engines' queue, in flight and KV use). --policy-config sets one per model.",
    ),
    click.option(
        "--session-header",
        default="x-session-id",
        show_default=True,
        help="Header whose value keys session affinity (policy `session`).",
    ),
    click.option(
        "--policy-config",
        type=click.Path(dir_okay=False, path_type=Path),
        help="YAML/JSON file: policy per model, scored policies' weights, load bound, prefix blocks, "
        "metrics scrape interval (see corral.router.routing.config). Its `policy` overrides --policy.",
    ),
    click.option(
        "--tokenizer",
        help="How the engines tokenize prompts: `sim` for `corral sim` engines, or a model directory or name "
        "(needs the optional `transformers` package). With it, prefix routing (policies `prefix`, `load`) "
        "reads the KV-cache events of every engine that publishes them (--kv-events-config; address from its "
        "supervisor, the backends file's kv_events=, the pod annotation corral.dev/kv-events) and routes by "
        "the longest prefix each engine holds; without it, or for engines without events, by approximate "
        "prefix memory.",
    ),
    click.option(
        "--slow-start-seconds",
        default=0.0,
        show_default=True,
        type=click.FloatRange(min=0, max=3600),
        help="An endpoint that becomes routable (READY, woken, restarted, back from an ejection, a new "
        "group) takes a share of traffic rising from 10%% of its full share to all of it over this many "
        "seconds, in every policy. 0 turns it off; per model: `slow_start_*` in --policy-config.",
    ),
]


def _apply(options: list[Callable[[Command], Command]], command: Command) -> Command:
    for option in reversed(options):  # the first listed shows first in --help
        command = option(command)
    return command


def membership_options(command: Command) -> Command:
    """--backend, --prefill, --decode, --supervised, the supervisor tokens, --router-id, the stream
    heartbeat, --carry-adapters-seconds, --backends-file, --discovery and its k8s flags, the probes."""
    return _apply(_MEMBERSHIP, command)


def policy_options(command: Command) -> Command:
    """--policy, --session-header, --policy-config, --tokenizer, --slow-start-seconds."""
    return _apply(_POLICY, command)
