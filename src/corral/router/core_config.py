"""The core's flags (corral.router.core_options) checked and turned into the core's part of a
RouterConfig, for `corral router` and `corral epp` alike: a usage error names the flag that is wrong."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from corral.router.app import RouterConfig
from corral.router.core import KubernetesDiscovery
from corral.router.discovery.adapter_carry import CarrySettings
from corral.router.discovery.backends_file import BackendsFileError, read_backends
from corral.router.discovery.supervisor_stream import (
    StreamSettings,
    TokenFor,
    default_router_id,
    per_pod_tokens,
)
from corral.router.routing.config import PolicyConfigError, RoutingConfig, load_routing_config
from corral.router.routing.prompt_tokens import prompt_tokens
from corral.supervisor_tokens import FleetKeyError, TokenFileError, read_fleet_key, read_management_token

# The flags of corral.router.core_options, by their parameter names: what `core_config` takes.
CORE_FLAGS = (
    "backends",
    "prefill",
    "decode",
    "supervised",
    "supervisor_port",
    "supervisor_token_file",
    "supervisor_token_key_file",
    "router_id",
    "supervisor_heartbeat",
    "carry_adapters_seconds",
    "backends_file",
    "discovery",
    "namespace",
    "selector",
    "kubeconfig",
    "engine_port",
    "k8s_resync_seconds",
    "k8s_watch_timeout",
    "probe_timeout",
    "models_refresh_seconds",
    "policy",
    "session_header",
    "policy_config",
    "tokenizer",
    "slow_start_seconds",
)


def core_config_of(flags: Mapping[str, Any]) -> RouterConfig:
    """`core_config` of the core's flags among a command's (the others are the front door's own)."""
    return core_config(**{name: flags[name] for name in CORE_FLAGS})


_SUPERVISED = re.compile(r"^(https?://[^=\s]+)=(https?://\S+)$")
_ENGINE_URL = re.compile(r"^https?://[^=\s]+$")


def parse_supervised(specs: tuple[str, ...]) -> dict[str, str]:
    """`ENGINE_URL=SUPERVISOR_URL` pairs; a usage error names the one that is not."""
    pairs: dict[str, str] = {}
    for spec in specs:
        match = _SUPERVISED.match(spec.strip())
        if match is None:
            raise click.UsageError(
                f"--supervised {spec!r}: write ENGINE_URL=SUPERVISOR_URL, "
                "e.g. http://127.0.0.1:9001=http://127.0.0.1:9101"
            )
        pairs[match.group(1).rstrip("/")] = match.group(2).rstrip("/")
    return pairs


def parse_roles(prefill: tuple[str, ...], decode: tuple[str, ...]) -> dict[str, str]:
    """Engine url -> role from --prefill and --decode; a usage error names a URL given both roles or
    one that is not an http(s) URL."""
    roles: dict[str, str] = {}
    for flag, role, urls in (("--prefill", "prefill", prefill), ("--decode", "decode", decode)):
        for spec in urls:
            url = spec.strip().rstrip("/")
            if not _ENGINE_URL.match(url):
                raise click.UsageError(
                    f"{flag} {spec!r}: give the engine's base URL, e.g. http://127.0.0.1:9001"
                )
            if roles.get(url, role) != role:
                raise click.UsageError(
                    f"{url} is given as --prefill and --decode; an engine has one role (run it with "
                    'kv_role "kv_both" and list it once with --backend to let it do both)'
                )
            roles[url] = role
    return roles


def read_supervisor_token(path: Path | None) -> str | None:
    """The supervisors' management token: from the file, else $CORRAL_TOKEN, else none."""
    try:
        return read_management_token(path)
    except TokenFileError as exc:
        raise click.UsageError(exc.naming("--supervisor-token-file")) from None


def core_config(
    *,
    backends: tuple[str, ...],
    prefill: tuple[str, ...],
    decode: tuple[str, ...],
    supervised: tuple[str, ...],
    supervisor_port: int | None,
    supervisor_token_file: Path | None,
    supervisor_token_key_file: Path | None,
    router_id: str | None,
    supervisor_heartbeat: float,
    carry_adapters_seconds: float,
    backends_file: Path | None,
    discovery: str | None,
    namespace: str | None,
    selector: str | None,
    kubeconfig: str | None,
    engine_port: int,
    k8s_resync_seconds: float,
    k8s_watch_timeout: int,
    probe_timeout: float,
    models_refresh_seconds: float,
    policy: str,
    session_header: str,
    policy_config: Path | None,
    tokenizer: str | None,
    slow_start_seconds: float,
) -> RouterConfig:
    """The core's part of the configuration, checked: a usage error names the flag that is wrong.
    Each front door adds its own settings with `dataclasses.replace`."""
    if discovery is None:
        discovery = "file" if backends_file is not None else "static"
    supervisors = parse_supervised(supervised)
    roles = parse_roles(prefill, decode)
    backends = tuple(dict.fromkeys([*(b.rstrip("/") for b in backends), *supervisors, *roles]))
    token = read_supervisor_token(supervisor_token_file)
    tokens = _per_pod_tokens(supervisor_token_key_file, supervisor_token_file, discovery)
    kubernetes: KubernetesDiscovery | None = None
    if supervisor_port is not None and discovery != "k8s":
        raise click.UsageError("--supervisor-port is for --discovery k8s; use --supervised otherwise.")
    if discovery == "k8s":
        if backends or backends_file:
            raise click.UsageError(
                "--discovery k8s takes no --backend, --prefill, --decode, --supervised or --backends-file "
                "(label the pods corral.dev/role=prefill|decode instead)."
            )
        if not namespace or not selector:
            raise click.UsageError(
                "--discovery k8s needs --namespace NS and --selector LABELS (e.g. app=vllm)."
            )
        kubernetes = KubernetesDiscovery(
            namespace=namespace,
            selector=selector,
            kubeconfig=kubeconfig,
            engine_port=engine_port,
            resync_seconds=k8s_resync_seconds,
            watch_timeout_seconds=k8s_watch_timeout,
            supervisor_port=supervisor_port,
        )
    elif discovery == "file":
        if backends_file is None or backends:
            raise click.UsageError(
                "--discovery file needs --backends-file PATH and no --backend, --prefill or --decode "
                "(write role=prefill|decode on the file's lines instead)."
            )
        try:
            read_backends(backends_file)
        except BackendsFileError as exc:
            raise click.UsageError(str(exc)) from None
    elif not backends:
        raise click.UsageError(
            "Name the engines: --backend URL, --prefill URL and --decode URL, or "
            "--supervised ENGINE_URL=SUPERVISOR_URL (repeatable), "
            "--backends-file PATH, or --discovery k8s --namespace NS --selector LABELS."
        )
    elif backends_file is not None:
        raise click.UsageError("Use either --backend/--supervised or --backends-file, not both.")
    return RouterConfig(
        backends=backends,
        supervisors=supervisors,
        roles=roles,
        streams=StreamSettings(
            router_id=router_id or default_router_id(),
            token=token,
            tokens=tokens,
            heartbeat_seconds=supervisor_heartbeat,
        ),
        carry_adapters=CarrySettings(hold_seconds=carry_adapters_seconds) if carry_adapters_seconds else None,
        backends_file=backends_file,
        kubernetes=kubernetes,
        probe_timeout=probe_timeout,
        policy=policy,
        session_header=session_header.lower(),
        routing=_routing_config(policy_config),
        slow_start_seconds=slow_start_seconds,
        tokenizer=_tokenizer(tokenizer),
        models_refresh_seconds=models_refresh_seconds,
    )


def _tokenizer(source: str | None) -> str | None:
    """`--tokenizer`, checked here so that a bad one stops the start with its reason."""
    try:
        prompt_tokens(source)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tokenizer") from None
    return source


def _per_pod_tokens(key_file: Path | None, token_file: Path | None, discovery: str) -> TokenFor | None:
    """--supervisor-token-key-file: each pod's token from the fleet key; a usage error names a bad key."""
    if key_file is None:
        return None
    if discovery != "k8s":
        raise click.UsageError(
            "--supervisor-token-key-file derives each pod's token from its name: it needs --discovery k8s; "
            "use --supervisor-token-file otherwise."
        )
    if token_file is not None:
        raise click.UsageError(
            "Use either --supervisor-token-key-file (a token per pod) or --supervisor-token-file, not both."
        )
    try:
        return per_pod_tokens(read_fleet_key(key_file))
    except FleetKeyError as exc:
        raise click.UsageError(f"--supervisor-token-key-file: {exc}") from None


def _routing_config(path: Path | None) -> RoutingConfig:
    if path is None:
        return RoutingConfig()
    try:
        return load_routing_config(path)
    except PolicyConfigError as exc:
        raise click.UsageError(str(exc)) from None
