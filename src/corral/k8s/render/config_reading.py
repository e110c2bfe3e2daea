"""Reading a `corral.yaml`: YAML into the `CorralDeployment` model, then the checks that span fields
(paths hidden by mounts, dependency targets). Every problem is the field's path, the value found and
what to do; all of them are reported at once, before anything is rendered.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from corral.engine.flags import serving_settings
from corral.engine.kv_events_address import KV_EVENTS_FLAG
from corral.engine.revisions import OTHER_REVISIONS, is_pinned
from corral.gate_spec import parse_gate_spec
from corral.k8s.render import commands
from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.images_config import router_image
from corral.k8s.render.kv_events_plan import SIM_TOKENIZER
from corral.k8s.render.parts import HOME
from corral.k8s.render.pd_config import PD_OWNED_FLAGS, SIDE_CHANNEL_HOST_ENV, SIDE_CHANNEL_PORT_ENV
from corral.redaction import redact_argv, redact_env


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the config: where, what was there, and what to do."""

    field: str
    value: Any
    message: str

    def __str__(self) -> str:
        shown = "(missing)" if self.value is _MISSING else repr(self.value)
        return f"{self.field}: {shown}: {self.message}"


_MISSING: Any = object()


class ConfigError(Exception):
    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s):\n{lines}")


def load_config(path: Path) -> CorralDeployment:
    """Read, parse and check `path`; raises ConfigError naming every problem found."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [Problem("(file)", source, f"unreadable: {exc}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [Problem("(file)", source, f"not valid YAML: {exc}")]) from None
    return parse_config(data, source)


def parse_config(data: Any, source: str = "corral.yaml") -> CorralDeployment:
    """Check a parsed config: field types and ranges first, then the rules between fields."""
    if not isinstance(data, dict):
        raise ConfigError(
            source, [Problem("(top level)", type(data).__name__, "expected a mapping of config fields")]
        )
    data, pd_problems = _pd_totals(data)
    try:
        config = CorralDeployment.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, pd_problems + [_problem(err) for err in exc.errors()]) from None
    if pd_problems:
        raise ConfigError(source, pd_problems)
    problems = cross_check(config)
    if problems:
        raise ConfigError(source, problems)
    return config


def cross_check(config: CorralDeployment) -> list[Problem]:
    """The rules that span fields: GPUs that fit, ports that differ, gates that can open."""
    problems: list[Problem] = []
    needed = config.replicas * config.engine.gpus
    if needed > config.gpu.capacity and config.pd is None:  # a P/D config: per role in _pd
        problems.append(
            Problem(
                "replicas",
                config.replicas,
                f"{config.replicas} engines × {config.engine.gpus} GPUs = {needed} GPUs, more than "
                f"gpu.capacity {config.gpu.capacity}; lower replicas or raise gpu.capacity",
            )
        )
    if config.engine.port == config.supervisor.port:
        problems.append(
            Problem(
                "supervisor.port",
                config.supervisor.port,
                "the engine already uses this port (engine.port); pick another",
            )
        )
    ports = {"engine.port": config.engine.port, "supervisor.port": config.supervisor.port}
    for field_name, port in ports.items():
        if config.supervisor.gate_port == port:
            problems.append(
                Problem(
                    "supervisor.gate_port",
                    port,
                    f"{field_name} already uses this port; the gate needs its own (e.g. 8080)",
                )
            )
    security = config.security
    if security.run_as_non_root and security.run_as_user == 0:
        problems.append(
            Problem(
                "security.run_as_user",
                0,
                "user 0 is root, which run_as_non_root forbids; pick another user (e.g. 1000) or set "
                "security.run_as_non_root: false",
            )
        )
    problems += _hidden_paths(config)
    problems += _startup_failure(config)
    problems += _tenant_keys(config)
    problems += _floating_revisions(config)
    problems += _lora(config)
    problems += _pd(config)
    problems += _kv_events(config)
    mounts = [PurePosixPath(v.mount_path) for v in config.engine.volumes]
    for i, spec in enumerate(config.dependencies.wait_for):
        gate = parse_gate_spec(spec)
        if gate.kind in ("unix", "file"):
            path = PurePosixPath(gate.target)
            if not _under(path, mounts):
                problems.append(
                    Problem(
                        f"dependencies.wait_for[{i}]",
                        spec,
                        f"{path} is not under any engine.volumes mount_path, so it can never appear "
                        "in the engine container; mount the directory that holds it",
                    )
                )
    probes = config.probes
    detection = probes.readiness_period_seconds * probes.readiness_failure_threshold
    if config.drain.propagation_seconds is not None and config.drain.propagation_seconds < detection:
        problems.append(
            Problem(
                "drain.propagation_seconds",
                config.drain.propagation_seconds,
                f"shorter than the {detection}s the kubelet needs to see readiness fall "
                "(probes.readiness_period_seconds × readiness_failure_threshold); raise it or leave it "
                "null to derive it",
            )
        )
    return problems


def _pd_totals(data: dict[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """A P/D config gives each role its replicas and GPUs; the top level's are then their totals,
    filled in here (a second copy written by hand could only disagree)."""
    pd = data.get("pd")
    if not isinstance(pd, dict):
        return data, []
    problems: list[Problem] = []
    gpu = data.get("gpu")
    gpu = dict(gpu) if isinstance(gpu, dict) else {}
    for field, value, per_role in (
        ("replicas", data.get("replicas", _MISSING), "replicas"),
        ("gpu.capacity", gpu.get("capacity", _MISSING), "gpu_capacity"),
    ):
        if value is not _MISSING:
            problems.append(
                Problem(
                    field,
                    value,
                    f"a P/D config sets it per role (pd.prefill.{per_role}, pd.decode.{per_role}); remove it",
                )
            )
    roles = [r for r in (pd.get("prefill"), pd.get("decode")) if isinstance(r, dict)]

    def total(key: str) -> int:  # a bad count is reported at its own pd.ROLE field
        counts = [r.get(key) for r in roles]
        return max(1, sum(c for c in counts if isinstance(c, int) and not isinstance(c, bool)))

    filled = {**data, "replicas": total("replicas"), "gpu": {**gpu, "capacity": total("gpu_capacity")}}
    return filled, problems


def _pd(config: CorralDeployment) -> list[Problem]:
    """Each role's engines fit its GPUs; the connector's flags and the side channel's port are the
    renderer's alone."""
    pd = config.pd
    if pd is None:
        return []
    problems: list[Problem] = []
    for name in ("prefill", "decode"):
        role = pd.prefill if name == "prefill" else pd.decode
        needed = role.replicas * config.engine.gpus
        if needed > role.gpu_capacity:
            problems.append(
                Problem(
                    f"pd.{name}.replicas",
                    role.replicas,
                    f"{role.replicas} engines × {config.engine.gpus} GPUs = {needed} GPUs, more than "
                    f"pd.{name}.gpu_capacity {role.gpu_capacity}; lower replicas or raise gpu_capacity",
                )
            )
    for arg in config.engine.args:
        if arg.split("=", 1)[0] in PD_OWNED_FLAGS:
            problems.append(
                Problem(
                    "engine.args",
                    arg,
                    "a P/D config renders the connector from pd.kv_transfer_config; remove it from args",
                )
            )
    for env in (SIDE_CHANNEL_HOST_ENV, SIDE_CHANNEL_PORT_ENV):
        if env in config.engine.env:
            problems.append(
                Problem(
                    f"engine.env.{env}",
                    config.engine.env[env],
                    "a P/D config sets it (the pod IP, pd.side_channel_port); remove it",
                )
            )
    if config.engine.serving_group is not None:
        problems.append(
            Problem(
                "engine.serving_group",
                config.engine.serving_group,
                "a P/D fleet's engines are paired one prefill with one decode engine, not served as "
                "one group; remove it",
            )
        )
    ports = {
        "engine.port": config.engine.port,
        "supervisor.port": config.supervisor.port,
        "supervisor.gate_port": config.supervisor.gate_port,
    }
    for field_name, port in ports.items():
        if port == pd.side_channel_port:
            problems.append(
                Problem(
                    "pd.side_channel_port",
                    port,
                    f"{field_name} already uses this port; NIXL's side channel needs its own (e.g. 5600)",
                )
            )
    return problems


def _kv_events(config: CorralDeployment) -> list[Problem]:
    """The engines' --kv-events-config and its ports are the renderer's while kv_events.enabled; a
    router.tokenizer other than sim needs `transformers`, which the Corral router image lacks."""
    problems: list[Problem] = []
    spec = config.kv_events
    if spec.enabled:
        places = [("engine.args", config.engine.args)]
        if config.pd is not None:
            places += [(f"pd.{r}.args", config.pd.role(r).args) for r in ("prefill", "decode")]
        bundle = config.supervisor.rollback_bundle
        if bundle is not None:
            places.append(("supervisor.rollback_bundle.engine_args", bundle.engine_args))
        for where, args in places:
            for arg in args:
                if arg.split("=", 1)[0] == KV_EVENTS_FLAG:
                    problems.append(
                        Problem(
                            where,
                            arg,
                            "the renderer sets --kv-events-config from kv_events (port, replay_port) "
                            "where the engines can publish; remove it, or set kv_events.enabled: false "
                            "to run your own",
                        )
                    )
        taken = {
            "engine.port": config.engine.port,
            "supervisor.port": config.supervisor.port,
            "supervisor.gate_port": config.supervisor.gate_port,
            **({"pd.side_channel_port": config.pd.side_channel_port} if config.pd is not None else {}),
        }
        for field_name, port in [("kv_events.port", spec.port), ("kv_events.replay_port", spec.replay_port)]:
            for other, used in taken.items():
                if port == used:
                    problems.append(
                        Problem(field_name, port, f"{other} already uses this port; pick another (e.g. 5557)")
                    )
            taken[field_name] = port
    tokenizer = config.router.tokenizer
    if tokenizer is not None and tokenizer != SIM_TOKENIZER:
        if config.router.image == router_image(config.images.registry):
            problems.append(
                Problem(
                    "router.tokenizer",
                    tokenizer,
                    f"loading a model's tokenizer needs the `transformers` package, which the Corral "
                    f"router image ({config.router.image}) does not have, so the router would not start; "
                    "give router.image an image with it (e.g. FROM that image, pip install transformers), "
                    "or leave router.tokenizer out to route by the router's prefix memory",
                )
            )
    return problems


def _tenant_keys(config: CorralDeployment) -> list[Problem]:
    """The rendered router listens on the pod network (0.0.0.0) and sends the engines' API key with what
    it forwards: without tenant keys of its own, anyone in the cluster who reaches it is served with
    that key."""
    key = config.engine_api_key
    if key is None or config.router.tenant_keys is not None:
        return []
    return [
        Problem(
            "router.tenant_keys",
            _MISSING,
            f"the engines enforce an API key (engine.secret_env VLLM_API_KEY from Secret {key.secret_name}) "
            "and the router, listening on 0.0.0.0, would send it for any client that reaches it; put an "
            "API keys file (a YAML list of {name, key_sha256}) in a Secret and name it: "
            f"router.tenant_keys: {{secret_name: {config.name}-router-tenants, key: tenants.yaml}}",
        )
    ]


def _startup_failure(config: CorralDeployment) -> list[Problem]:
    """A rollback needs its bundle, which must not take the rendered command's name."""
    s = config.supervisor
    if s.on_startup_failure == "rollback" and s.rollback_bundle is None:
        return [
            Problem(
                "supervisor.rollback_bundle",
                _MISSING,
                "supervisor.on_startup_failure rollback needs the bundle to roll back to: "
                "{name, engine_args, env} added to the rendered engine command",
            )
        ]
    if s.rollback_bundle is not None and s.rollback_bundle.name == "initial":
        return [
            Problem(
                "supervisor.rollback_bundle.name",
                "initial",
                "'initial' is the rendered engine command's own bundle name; name the rollback bundle "
                "otherwise (e.g. previous)",
            )
        ]
    return []


def _floating_revisions(config: CorralDeployment) -> list[Problem]:
    """A hub model must be pinned to a commit, as the supervisor's PRECHECK refuses to start it
    otherwise: caught here, the renderer fails instead of every pod failing at its first start."""
    model = config.model
    if not model.is_hub_id or model.allow_floating_revision:
        return []
    fix = (
        "or set model.allow_floating_revision: true to serve whatever it points to when each pod starts "
        "(the supervisor's --allow-floating-revision)"
    )
    problems: list[Problem] = []
    if model.revision is None:
        problems.append(
            Problem(
                "model.revision",
                _MISSING,
                f"model.path {model.path!r} is a hub id (not an absolute path in the container) and no "
                "revision pins it, so the supervisor's PRECHECK would refuse to start it; set "
                f"model.revision to the 40-hex commit to serve, {fix}",
            )
        )
    elif not is_pinned(model.revision):
        problems.append(
            Problem(
                "model.revision",
                model.revision,
                "a branch or tag, which can move to other files (only a 40-hex commit is pinned), so the "
                "supervisor's PRECHECK would refuse to start it; set model.revision to the commit it "
                f"names now, {fix}",
            )
        )
    rollback = config.supervisor.rollback_bundle
    for field, args in (
        ("engine.args", config.engine.args),
        ("supervisor.rollback_bundle.engine_args", rollback.engine_args if rollback is not None else []),
    ):
        settings = serving_settings(args)
        for flag, key in OTHER_REVISIONS:
            value = settings.get(key)
            if isinstance(value, str) and not is_pinned(value):
                problems.append(
                    Problem(
                        field,
                        f"{flag} {value}",
                        f"{value!r} is not a 40-hex commit, so the supervisor's PRECHECK would refuse "
                        f"{model.path!r}; pin {flag} to a commit, {fix}",
                    )
                )
    return problems


def _under(path: PurePosixPath, mounts: list[PurePosixPath]) -> bool:
    """Whether `path` is one of `mounts` or inside one."""
    return any(path == m or m in path.parents for m in mounts)


def _lora(config: CorralDeployment) -> list[Problem]:
    """Each adapter's path inside a mounted volume, and runtime LoRA updating not turned off: the
    supervisor loads every adapter through the engine's /v1/load_lora_adapter."""
    mounts = [PurePosixPath(v.mount_path) for v in config.engine.volumes]
    problems = [
        Problem(
            f"engine.lora[{i}].path",
            adapter.path,
            "not under any engine.volumes mount_path, so the engine can never load it; mount the "
            "directory that holds it",
        )
        for i, adapter in enumerate(config.engine.lora)
        if not _under(PurePosixPath(adapter.path), mounts)
    ]
    allowed = config.engine.env.get(commands.RUNTIME_LORA_ENV, "1").strip().lower()
    if config.engine.lora and allowed not in ("1", "true"):
        problems.append(
            Problem(
                f"engine.env.{commands.RUNTIME_LORA_ENV}",
                config.engine.env[commands.RUNTIME_LORA_ENV],
                "engine.lora needs it (the supervisor loads each adapter through the engine's "
                "/v1/load_lora_adapter, which vLLM serves only with it): remove it or set it to 1",
            )
        )
    return problems


def _hidden_paths(config: CorralDeployment) -> list[Problem]:
    """A hostPath volume mounted over a directory the renderer mounts would hide it (the pod's token,
    the state dir, the writable paths of a read-only root filesystem)."""
    own = [commands.POD_TOKEN_DIR, commands.STATE_DIR, commands.BUNDLES_DIR, "/tmp", "/dev/shm", HOME]
    own += config.security.writable_paths
    problems = []
    for i, volume in enumerate(config.engine.volumes):
        mount = PurePosixPath(volume.mount_path)
        for path in map(PurePosixPath, own):
            if mount == path or mount in path.parents:
                problems.append(
                    Problem(
                        f"engine.volumes[{i}].mount_path",
                        volume.mount_path,
                        f"would hide {path}, which corral mounts in the engine container; mount it elsewhere",
                    )
                )
    return problems


def _problem(err: Any) -> Problem:
    loc: tuple[str | int, ...] = tuple(err["loc"])
    where = _loc_text(loc)
    kind = err["type"]
    value = _masked(err.get("input", _MISSING))
    info = _field_info(loc)
    hint = f" ({info.description})" if info is not None and info.description else ""
    if kind == "missing":
        return Problem(where, _MISSING, f"required{hint}")
    if kind == "extra_forbidden":
        known = _known_fields(loc[:-1])
        return Problem(where, value, f"not a config field; the fields here are: {', '.join(known)}")
    message = str(err["msg"]).removeprefix("Value error, ")
    return Problem(where, value, f"{message}{hint}")


def _masked(value: Any) -> Any:
    """A refused value as the message shows it: the secrets of a list of arguments or of a mapping of
    environment names masked (`corral.redaction`), so an error never prints the secret it refuses."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return redact_argv(value)
    if isinstance(value, str):
        return redact_argv([value])[0]
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return redact_env({str(k): v for k, v in value.items()})
    return value


def _loc_text(loc: tuple[str | int, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(top level)"


def _section_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            found = _section_of(arg)
            if found is not None:
                return found
    return None


def _walk(loc: tuple[str | int, ...]) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The section and field that `loc` (a pydantic error location) points at, if it points at one."""
    model: type[BaseModel] | None = CorralDeployment
    info: FieldInfo | None = None
    key_next = False
    for part in loc:
        if isinstance(part, int):
            continue
        if key_next:  # a key of a mapping field, e.g. the NAME in engine.secret_env.NAME
            key_next = False
            continue
        if model is None or part not in model.model_fields:
            return None, None
        info = model.model_fields[part]
        model = _section_of(info.annotation)
        key_next = typing.get_origin(info.annotation) is dict
    return model, info


def _field_info(loc: tuple[str | int, ...]) -> FieldInfo | None:
    return _walk(loc)[1]


def _known_fields(loc: tuple[str | int, ...]) -> list[str]:
    model = _walk(loc)[0] if loc else CorralDeployment
    return list(model.model_fields) if model is not None else []
