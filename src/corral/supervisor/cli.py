"""`corral supervise [options] -- <engine command...>` (the engine container's entrypoint) and
`corral supervise prestop` (what a Kubernetes preStop hook runs). Bad input is one line on stderr and
exit code 2, before anything is started.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import click

from corral.aio import run as run_on_uvloop
from corral.bundle_spec import BundleError, BundleSpec, load_bundle
from corral.engine.pd_protocol import ROLES
from corral.state_home import corral_state_dir, state_dir_problem
from corral.supervisor.checks.adapters import AdapterSpecError, parse_lora
from corral.supervisor.checks.dependencies import DependencyGate, GateSpecError, parse_gate
from corral.supervisor.commands.precheck import explain_precheck, precheck_options, precheck_settings
from corral.supervisor.commands.prestop import run_prestop
from corral.supervisor.lifecycle.config import SupervisorConfig, is_loopback
from corral.supervisor.lifecycle.drain import DrainPolicy, DrainSettings
from corral.supervisor.lifecycle.failure_strategy import (
    CHOICES,
    OnStartupFailure,
    StrategyError,
    check_rollback_bundle,
    parse_on_startup_failure,
)
from corral.supervisor.lifecycle.memory_checks import (
    DEFAULT_SLEEP_RESIDUE_GIB,
    DEFAULT_WAKE_TOLERANCE,
    MemoryThresholds,
)
from corral.supervisor.lifecycle.pd_role import kv_transfer_problem
from corral.supervisor.serve import printer, serve
from corral.supervisor_tokens import TokenFileError, read_management_token


class _RunByDefault(click.Group):
    """`corral supervise --port … -- cmd` means `corral supervise run --port … -- cmd`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_RunByDefault, context_settings={"help_option_names": ["-h", "--help"]})
def supervise() -> None:
    """Supervise one engine: `corral supervise [run] [OPTIONS] -- ENGINE COMMAND...`, or
    `corral supervise prestop` to drain it from a preStop hook."""


def _bad_input(message: str) -> NoReturn:
    click.echo(f"corral supervise: {message}", err=True)
    sys.exit(2)


def _default_state_dir(port: int) -> Path:
    return corral_state_dir() / f"supervise-{port}"


def _check_engine_command(argv: tuple[str, ...]) -> None:
    if not argv:
        _bad_input("no engine command: put it after `--`, e.g. `-- vllm serve MODEL --port 8000`")
    exe = argv[0]
    if os.sep in exe:
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            _bad_input(f"engine command {exe!r} is not an executable file")
    elif shutil.which(exe) is None:
        _bad_input(f"engine command {exe!r} not found on PATH")


def read_token(token_file: Path | None) -> str | None:
    """The management token from `token_file`, else from $CORRAL_TOKEN; exits 2 if the file is unusable."""
    try:
        return read_management_token(token_file)
    except TokenFileError as exc:
        _bad_input(str(exc))


def _parse_gates(specs: tuple[str, ...]) -> tuple[DependencyGate, ...]:
    try:
        return tuple(parse_gate(s) for s in specs)
    except GateSpecError as exc:
        _bad_input(str(exc))


_seconds = click.FloatRange(min=0.0)


@supervise.command(name="run")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address for probes and management.")
@click.option("--port", default=8081, show_default=True, type=click.IntRange(1, 65535))
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
@click.option("--dependency-timeout", default=600.0, show_default=True, type=_seconds)
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
@click.option("--stall-seconds", default=60.0, show_default=True, type=click.FloatRange(min=0.1))
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
@click.option("--drain-policy", type=click.Choice(["wait", "abort"]), default="wait", show_default=True)
@click.option(
    "--propagation-timeout",
    default=10.0,
    show_default=True,
    type=_seconds,
    help="Longest wait for routing to leave (no new request for --quiet-period).",
)
@click.option("--quiet-period", default=1.0, show_default=True, type=_seconds)
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
    "--role",
    type=click.Choice(ROLES),
    help="The engine's role in prefill/decode disaggregation, published to routers (default: what the "
    "engine command's --kv-transfer-config kv_role says: kv_producer prefill, kv_consumer decode, "
    "else both).",
)
@precheck_options
@click.argument("engine_command", nargs=-1, type=click.UNPROCESSED)
def run_command(
    host: str,
    port: int,
    engine_url: str,
    model: str | None,
    wait_for: tuple[str, ...],
    dependency_timeout: float,
    startup_timeout: float,
    startup_restarts: int,
    failure_restarts: int,
    restart_backoff: float,
    stall_seconds: float,
    sleep_residue_gib: float,
    wake_tolerance: float,
    drain_policy: str,
    propagation_timeout: float,
    quiet_period: float,
    drain_timeout: float,
    drain_transfer_wait: float,
    shutdown_timeout: float,
    state_dir: Path | None,
    oplog_max_bytes: int,
    oplog_keep: int,
    token_file: Path | None,
    gate_port: int | None,
    gate_host: str,
    preload_command: str | None,
    preload_health: str | None,
    preload_restarts: int,
    lora: tuple[str, ...],
    bundle_files: tuple[Path, ...],
    bundle_name: str,
    on_startup_failure: str,
    role: str | None,
    engine_command: tuple[str, ...],
    **precheck_flags: Any,
) -> None:
    """Start ENGINE COMMAND once its dependencies are up, report it ready only once it serves, and
    drain it before it stops."""
    gates = _parse_gates(wait_for)
    engine_host = urlsplit(engine_url).hostname or ""
    if gate_port is not None and not is_loopback(engine_host):
        _bad_input(
            f"--gate-port needs the engine on loopback (its dev endpoints must be unreachable from outside); "
            f"--engine-url {engine_url} is not"
        )
    preload_argv: tuple[str, ...] = ()
    if preload_command is not None:
        preload_argv = tuple(shlex.split(preload_command))
        if not preload_argv or not preload_health:
            _bad_input("--preload-command needs a command and --preload-health URL (the daemon's /health)")
        if "ipc_cache" not in " ".join(engine_command):
            _bad_input("--preload-command: the engine command must load from it (--load-format ipc_cache)")
        gates = (*gates, *_parse_gates((preload_health,)))
    try:
        adapters = tuple(parse_lora(spec) for spec in lora)
    except AdapterSpecError as exc:
        _bad_input(str(exc))
    _check_engine_command(engine_command)
    if (kv_problem := kv_transfer_problem(engine_command)) is not None:
        _bad_input(f"the engine command's {kv_problem}")
    bundles = _read_bundles(bundle_files, bundle_name)
    strategy = _startup_failure_strategy(on_startup_failure, bundles, bundle_name)
    explain = precheck_flags.pop("explain")
    precheck = precheck_settings(precheck_flags)
    if explain:
        sys.exit(run_on_uvloop(explain_precheck(engine_command, precheck, preload_argv, click.echo)))
    token = read_token(token_file)
    if token is None and not is_loopback(host):
        _bad_input(
            f"refusing to serve the management API on {host} without a token: "
            "pass --token-file or set CORRAL_TOKEN (or bind --host 127.0.0.1)"
        )
    state_dir = state_dir or _default_state_dir(port)
    if (problem := state_dir_problem(state_dir)) is not None:
        _bad_input(
            f"state dir {state_dir} cannot be used: {problem}; pass --state-dir DIR, writable by this user"
        )
    config = SupervisorConfig(
        engine_argv=engine_command,
        engine_url=engine_url.rstrip("/"),
        host=host,
        port=port,
        model=model,
        gates=gates,
        dependency_timeout=dependency_timeout,
        startup_timeout=startup_timeout,
        startup_restarts=startup_restarts,
        failure_restarts=failure_restarts,
        restart_backoff=restart_backoff,
        stall_seconds=stall_seconds,
        memory=MemoryThresholds.from_flags(sleep_residue_gib, wake_tolerance),
        drain=DrainSettings(
            policy=DrainPolicy(drain_policy),
            propagation_timeout=propagation_timeout,
            quiet_period=quiet_period,
            drain_timeout=drain_timeout,
            shutdown_timeout=shutdown_timeout,
            transfer_wait=drain_transfer_wait,
        ),
        state_dir=state_dir,
        oplog_max_bytes=oplog_max_bytes,
        oplog_keep=oplog_keep,
        token=token,
        lora=adapters,
        bundles=bundles,
        bundle_name=bundle_name,
        on_startup_failure=strategy,
        role=role,
        precheck=precheck,
        preload_argv=preload_argv,
        preload_health=preload_health,
        preload_restarts=preload_restarts,
        gate_port=gate_port,
        gate_host=gate_host,
    )
    sys.exit(run_on_uvloop(serve(config)))


def _read_bundles(files: tuple[Path, ...], running: str) -> tuple[BundleSpec, ...]:
    """The bundles declared with --bundle; exits 2 naming a bad file or a name used twice."""
    bundles: dict[str, BundleSpec] = {}
    for path in files:
        try:
            bundle = load_bundle(path)
        except BundleError as exc:
            _bad_input(str(exc))
        if bundle.name in bundles or bundle.name == running:
            _bad_input(f"--bundle {path}: the name {bundle.name!r} is declared twice (or is --bundle-name)")
        bundles[bundle.name] = bundle
    return tuple(bundles.values())


def _startup_failure_strategy(text: str, bundles: tuple[BundleSpec, ...], running: str) -> OnStartupFailure:
    """--on-startup-failure, its rollback bundle declared; exits 2 with the fix otherwise."""
    try:
        choice = parse_on_startup_failure(text)
        check_rollback_bundle(choice, [b.name for b in bundles], running)
    except StrategyError as exc:
        _bad_input(str(exc))
    return choice


@supervise.command(name="prestop")
@click.option("--url", default="http://127.0.0.1:8081", show_default=True, help="The supervisor's address.")
@click.option("--token-file", type=click.Path(path_type=Path), default=None)
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
        _bad_input(str(exc))
    if out == "-":
        click.echo(token)
        return
    try:
        write_atomically(Path(out), token.encode() + b"\n", mode=0o600)
    except OSError as exc:
        _bad_input(f"cannot write the token to {out!r}: {exc.strerror or exc}")
    click.echo(f"corral supervise: wrote the token of pod {namespace}/{pod_name} to {out}", err=True)
