"""`corral supervise [options] -- <engine command...>` (the engine container's entrypoint) and
`corral supervise prestop` (what a Kubernetes preStop hook runs). Bad input is one line on stderr and
exit code 2, before anything is started.

This module holds the flags; what checks them and runs the supervisor is corral.supervisor.start
(and, for prestop, the drain client), imported when a command runs, so that `--help` starts fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from corral.engine.pd_protocol import ROLES
from corral.supervisor.commands.bad_input import bad_input, read_token
from corral.supervisor.commands.precheck import precheck_options
from corral.supervisor.lifecycle.failure_strategy import CHOICES
from corral.supervisor.lifecycle.idle_settings import MAX_AFTER_SECONDS, peer_urls
from corral.supervisor.lifecycle.memory_defaults import DEFAULT_SLEEP_RESIDUE_GIB, DEFAULT_WAKE_TOLERANCE
from corral.supervisor_defaults import DEFAULT_UNANSWERED_SECONDS
from corral.tracing.flag import otlp_traces_option


class _RunByDefault(click.Group):
    """`corral supervise --port … -- cmd` means `corral supervise run --port … -- cmd`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["run", *args]
        return super().parse_args(ctx, args)


def check_sleep_peers(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    try:
        return peer_urls(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group(cls=_RunByDefault, context_settings={"help_option_names": ["-h", "--help"]})
def supervise() -> None:
    """Supervise one engine: `corral supervise [run] [OPTIONS] -- ENGINE COMMAND...`, or
    `corral supervise prestop` to drain it from a preStop hook."""


_seconds = click.FloatRange(min=0.0)


@supervise.command(name="run")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address for probes and management.")
@click.option(
    "--port",
    default=8081,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Port for probes (/livez, /readyz, /startupz) and the management API.",
)
@click.option(
    "--engine-url", default="http://127.0.0.1:8000", show_default=True, help="Where the engine answers."
)
@click.option("--model", default=None, help="Model the engine must list (default: the first it lists).")
@click.option(
    "--wait-for",
    "wait_for",
    multiple=True,
    metavar="SPEC",
    help="Dependency to wait for before starting: unix:PATH, tcp:HOST:PORT, http(s)://URL, file:PATH.",
)
@click.option(
    "--dependency-timeout",
    default=600.0,
    show_default=True,
    type=_seconds,
    help="Seconds every --wait-for dependency (and --preload-health) has to come up, one deadline for "
    "all; past it the start fails (--on-startup-failure).",
)
@click.option(
    "--startup-timeout",
    default=1800.0,
    show_default=True,
    type=_seconds,
    help="Seconds from engine start to READY (model load, warmup, smoke).",
)
@click.option(
    "--startup-restarts",
    default=3,
    show_default=True,
    type=click.IntRange(0),
    help="Restarts in place when the engine exits during startup.",
)
@click.option(
    "--failure-restarts",
    default=3,
    show_default=True,
    type=click.IntRange(0),
    help="Restarts in place after a READY engine stalls or exits.",
)
@click.option(
    "--restart-backoff",
    default=1.0,
    show_default=True,
    type=_seconds,
    help="First restart delay; doubles each time, capped at 30s.",
)
@click.option(
    "--stall-seconds",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="A READY engine counts as hung, and is failed and restarted (--failure-restarts), when for this "
    "long requests are running and no token is generated, /metrics does not answer, or an idle smoke "
    "request gets no answer.",
)
@click.option(
    "--unanswered-seconds",
    default=DEFAULT_UNANSWERED_SECONDS,
    show_default=True,
    type=click.FloatRange(min=0),
    help="A READY engine whose /health (asked every second) has not answered 200 for this long is "
    "withdrawn from routing: /readyz 503 and DRAINING/not_answering on the state stream, the engine "
    "kept. It returns READY once it answers and passes the smoke request again; --stall-seconds still "
    "fails and restarts it. 0 turns the withdrawal off.",
)
@click.option(
    "--sleep-after-seconds",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0, max=MAX_AFTER_SECONDS),
    help="Idle sleep: put a READY engine to sleep through the runbook's sleep (every check) once it has "
    "served no request for this long; a router's wake on demand brings it back. Never the last awake "
    "engine of its model (see --sleep-peer, --sleep-last-awake). 0: never.",
)
@click.option(
    "--sleep-level",
    default=1,
    show_default=True,
    type=click.IntRange(0, 2),
    help="Idle sleep's level: 0 pauses, 1 offloads the weights to host memory, 2 drops them.",
)
@click.option(
    "--sleep-mode",
    type=click.Choice(["wait", "abort", "keep"]),
    default="wait",
    show_default=True,
    help="Idle sleep's mode for requests still in the engine (an idle engine has none unless one came late).",
)
@click.option(
    "--sleep-peer",
    "sleep_peers",
    multiple=True,
    metavar="URL",
    callback=check_sleep_peers,
    help="The supervisor of another engine of the same model (repeatable, at most 64), asked for its "
    "/v1/state with this supervisor's token: idle sleep goes ahead only while such a peer is READY and "
    "stays awake.",
)
@click.option(
    "--sleep-last-awake",
    is_flag=True,
    help="Idle sleep may put the last awake engine of its model to sleep (the next request then waits "
    "for a wake).",
)
@click.option(
    "--sleep-residue-gib",
    default=DEFAULT_SLEEP_RESIDUE_GIB,
    show_default=True,
    type=click.FloatRange(min=0),
    help="GPU memory a level-1/2 sleeping engine may still hold per GPU (CUDA context, CUDA graphs, "
    "NCCL buffers); VERIFY reads it through NVML and fails the sleep above it.",
)
@click.option(
    "--wake-tolerance",
    default=DEFAULT_WAKE_TOLERANCE,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="A wake or reload must bring each GPU back to within this share of what it held before the sleep.",
)
@click.option(
    "--drain-policy",
    type=click.Choice(["wait", "abort"]),
    default="wait",
    show_default=True,
    help="What the drain before a stop (SIGTERM, prestop) does with requests in flight once routing "
    "has left: wait lets them finish within --drain-timeout; abort does not wait.",
)
@click.option(
    "--propagation-timeout",
    default=10.0,
    show_default=True,
    type=_seconds,
    help="Longest wait for routing to leave (no new request for --quiet-period).",
)
@click.option(
    "--quiet-period",
    default=1.0,
    show_default=True,
    type=_seconds,
    help="Seconds without a new request at the engine that show routing has left it (within "
    "--propagation-timeout).",
)
@click.option(
    "--drain-timeout",
    default=120.0,
    show_default=True,
    type=_seconds,
    help="Longest wait for in-flight requests under policy wait.",
)
@click.option(
    "--drain-transfer-wait",
    default=0.0,
    show_default=True,
    type=_seconds,
    help="Seconds a drain of a prefill engine waits for KV transfers its metrics do not show (a real "
    "vLLM's held blocks; e.g. its kv_lease_duration), within --drain-timeout; 0 relies on the routers' "
    "acknowledgements.",
)
@click.option(
    "--shutdown-timeout",
    default=30.0,
    show_default=True,
    type=_seconds,
    help="Seconds between SIGTERM and SIGKILL for the engine.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Operation log and lock (default: $XDG_STATE_HOME/corral/supervise-PORT).",
)
@click.option(
    "--oplog-max-bytes",
    default=64 * 1024 * 1024,
    show_default=True,
    type=click.IntRange(min=1024),
    help="Rotate the operation log (oplog.jsonl -> oplog.jsonl.1 …) past this size.",
)
@click.option(
    "--oplog-keep",
    default=3,
    show_default=True,
    type=click.IntRange(min=0),
    help="Rotated operation logs kept.",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path),
    default=None,
    help="Bearer token for the management API (else $CORRAL_TOKEN).",
)
@click.option(
    "--gate-port",
    default=None,
    type=click.IntRange(1, 65535),
    help="Serve the data path here (admission gate): only inference paths are forwarded, 503 unless "
    "READY, in-flight counted per model/adapter. The engine must then listen on loopback only.",
)
@click.option("--gate-host", default="0.0.0.0", show_default=True, help="Address of the gate's data port.")
@click.option(
    "--preload-command",
    default=None,
    metavar="CMD",
    help="The weight-cache daemon (e.g. 'vllm preload --model M --weight-cache-health-port 8100'), run "
    "before the engine and stopped after it; needs --preload-health and an engine with "
    "--load-format ipc_cache.",
)
@click.option(
    "--preload-health", default=None, metavar="URL", help="The daemon's health URL (200 when ready)."
)
@click.option(
    "--preload-restarts",
    default=3,
    show_default=True,
    type=click.IntRange(0),
    help="Restarts of a preload daemon that died (backoff as --restart-backoff), each time the engine is "
    "taken out of routing and started again from the new daemon; then FAILED.",
)
@click.option(
    "--lora",
    "lora",
    multiple=True,
    metavar="NAME=PATH",
    help="A LoRA adapter the engine must serve; loaded after every engine (re)start, before READY.",
)
@click.option(
    "--bundle",
    "bundle_files",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A bundle file (name, command, engine_args, env) this engine may be switched to with "
    "POST /v1/bundle (a rollout across hosts); repeatable. Only declared bundles can be run.",
)
@click.option(
    "--bundle-name",
    default="initial",
    show_default=True,
    help="The name of the bundle ENGINE COMMAND runs (what a rollback returns to).",
)
@click.option(
    "--on-startup-failure",
    default="restart",
    show_default=True,
    metavar="STRATEGY",
    help=f"What follows a start that cannot reach READY ({CHOICES}): restart = FAILED and /livez 503 "
    "(the kubelet restarts the pod); stay-unready = FAILED with /livez and /startupz 200 and /readyz 503, "
    "for a person to look; rollback=BUNDLE = switch once to a bundle declared with --bundle.",
)
@click.option(
    "--kernel-log",
    default=None,
    envvar="CORRAL_KERNEL_LOG",
    metavar="PATH|off",
    help="Where the GPU driver's Xid lines are read from, from each engine start on: /dev/kmsg (needs "
    "CAP_SYSLOG or kernel.dmesg_restrict=0) or a file the kernel log is appended to; off: none. NVML's Xid "
    "events are read too where NVML is [default: /dev/kmsg where readable].",
)
@click.option(
    "--role",
    type=click.Choice(ROLES),
    help="The engine's role in prefill/decode disaggregation, published to routers (default: what the "
    "engine command's --kv-transfer-config kv_role says: kv_producer prefill, kv_consumer decode, "
    "else both).",
)
@otlp_traces_option  # --otlp-traces-endpoint (corral.tracing.flag)
@precheck_options
@click.argument("engine_command", nargs=-1, type=click.UNPROCESSED)
def run_command(**flags: Any) -> None:
    """Start ENGINE COMMAND once its dependencies are up, report it ready only once it serves, and
    drain it before it stops."""
    from corral.supervisor.start import start_supervisor

    start_supervisor(**flags)


@supervise.command(name="prestop")
@click.option("--url", default="http://127.0.0.1:8081", show_default=True, help="The supervisor's address.")
@click.option(
    "--token-file",
    type=click.Path(path_type=Path),
    default=None,
    help="The supervisor's bearer token (else $CORRAL_TOKEN).",
)
@click.option(
    "--policy",
    type=click.Choice(["wait", "abort"]),
    default=None,
    help="Override the supervisor's --drain-policy.",
)
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="Longest wait for the drain to finish.",
)
def prestop(url: str, token_file: Path | None, policy: str | None, timeout: float) -> None:
    """Drain the supervised engine and block until it is done (for a Kubernetes preStop hook)."""
    from corral.aio import run as run_on_uvloop
    from corral.supervisor.commands.prestop import run_prestop
    from corral.supervisor.serve import printer

    token = read_token(token_file)
    sys.exit(run_on_uvloop(run_prestop(url.rstrip("/"), token, policy, timeout, printer("[prestop]"))))


@supervise.command(name="derive-token")
@click.option(
    "--key-file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The fleet key (the Secret mounted only here and in the routers).",
)
@click.option("--namespace", required=True, help="The pod's namespace (downward API: metadata.namespace).")
@click.option("--pod-name", required=True, help="The pod's name (downward API: metadata.name).")
@click.option(
    "--out",
    required=True,
    help="Where to write the token (mode 0600), for `corral supervise --token-file`; `-` prints it.",
)
def derive_token(key_file: Path, namespace: str, pod_name: str, out: str) -> None:
    """Write this pod's supervisor token, HMAC-SHA256(fleet key, "corral-supervisor:NAMESPACE/POD"):
    a token read out of one pod opens no other pod's supervisor (a Kubernetes init container)."""
    from corral.atomic_file import write_atomically
    from corral.supervisor_tokens import pod_token, read_fleet_key

    try:
        token = pod_token(read_fleet_key(key_file), namespace, pod_name)
    except ValueError as exc:  # FleetKeyError, or a namespace/name that names no pod
        bad_input(str(exc))
    if out == "-":
        click.echo(token)
        return
    try:
        write_atomically(Path(out), token.encode() + b"\n", mode=0o600)
    except OSError as exc:
        bad_input(f"cannot write the token to {out!r}: {exc.strerror or exc}")
    click.echo(f"corral supervise: wrote the token of pod {namespace}/{pod_name} to {out}", err=True)
