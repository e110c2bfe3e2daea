"""`corral up --config fleet.yaml`: a local fleet described in a file instead of flags.

    port: 8000
    model: sim-model
    engines: {count: 4, group_size: 2}     # or {prefill: 1, decode: 1}
    bundle: {name: initial, engine_args: ["--itl-ms", "5"]}   # or a bundle file's path
    router: {policy: least_request, slow_start_seconds: 10, workers: 1}
    drain_timeout: 10
    gate: true
    sleep_mode: true

Every field maps to one `corral up` flag (docs/fleet-yaml.md); a flag given on the command line wins
over the file. Errors name the file, the field's path, the value and what to write instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.bundle_spec import BundleError, BundleSpec, bundle_from_json, load_bundle
from corral.yaml_file import YamlFileError, read_yaml_file


class FleetConfigError(ValueError):
    """A fleet file is unreadable or invalid; the message names the file, the field and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnginesConfig(_Section):
    count: int | None = Field(
        default=None, ge=1, le=64, description="Engines that do prefill and decode (`--engines`)."
    )
    prefill: int = Field(default=0, ge=0, le=64, description="Prefill engines of a disaggregated fleet.")
    decode: int = Field(default=0, ge=0, le=64, description="Decode engines of a disaggregated fleet.")
    group_size: int = Field(
        default=1, ge=1, le=64, description="Engines per serving group, started and retired whole."
    )


class RouterConfig(_Section):
    policy: Literal["round_robin", "least_request", "session", "prefix", "load"] = Field(
        default="least_request", description="How the router picks an engine (`--policy`)."
    )
    slow_start_seconds: float | None = Field(
        default=None, ge=0, le=3600, description="Ramp a new or woken engine's share over this many seconds."
    )
    workers: int | None = Field(default=None, ge=1, le=64, description="Router processes sharing the port.")
    policy_config: Path | None = Field(
        default=None, description="A `corral router --policy-config` file (relative to this file)."
    )
    args: list[str] = Field(default_factory=list, description="More `corral router` flags, as a list.")


class FleetConfig(_Section):
    port: int = Field(default=8000, ge=1, le=65535, description="The router's port.")
    host: str = Field(default="127.0.0.1", description="The address everything binds.")
    model: str = Field(default="sim-model", description="The model name the engines serve.")
    engines: EnginesConfig = Field(
        default_factory=EnginesConfig, description="How many engines, in what roles."
    )
    bundle: dict[str, Any] | str | None = Field(
        default=None, description="The bundle the engines start from: inline, or a bundle file's path."
    )
    router: RouterConfig = Field(default_factory=RouterConfig, description="Router policy and options.")
    drain_timeout: float = Field(
        default=10.0, ge=0, description="Every supervisor's drain deadline, seconds."
    )
    gate: bool = Field(default=True, description="Route through each supervisor's admission gate.")
    sleep_mode: bool = Field(default=True, description="Engines with sleep mode (sleep, wake, reload).")
    startup_timeout: float = Field(default=60.0, ge=1, description="Seconds each member may take to answer.")
    stop_grace: float = Field(
        default=30.0, ge=0, description="Seconds each member gets to exit after SIGTERM."
    )


def load_fleet_config(path: Path) -> tuple[FleetConfig, set[str]]:
    """The file's fleet and the top-level fields it set (only those override `up`'s defaults)."""
    try:
        body = read_yaml_file(path, "fleet")
    except YamlFileError as exc:
        raise FleetConfigError(str(exc)) from None
    if not isinstance(body, dict):
        raise FleetConfigError(
            f"{path}: write a mapping, e.g. 'engines: {{count: 2}}' (see docs/fleet-yaml.md)"
        )
    try:
        config = FleetConfig.model_validate(body)
    except ValidationError as exc:
        raise FleetConfigError(f"{path}: " + "; ".join(_problem(err) for err in exc.errors())) from None
    return config, set(body)


def _problem(err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("dict[", "str")))
    if err["type"] == "extra_forbidden":
        return f"{where}: no such field (see docs/fleet-yaml.md for the fields)"
    if err["type"] == "missing":
        return f"{where}: required"
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}; it is {err['input']!r}"


def config_bundle(config: FleetConfig, path: Path) -> BundleSpec | None:
    """The bundle of the file: inline, or loaded from a path relative to the fleet file."""
    if isinstance(config.bundle, str):
        try:
            return load_bundle(path.parent / config.bundle)
        except BundleError as exc:
            raise FleetConfigError(f"{path}: bundle: {exc}") from None
    if config.bundle is not None:
        try:
            return bundle_from_json(config.bundle, f"{path}: bundle")
        except BundleError as exc:
            raise FleetConfigError(str(exc)) from None
    return None


def up_values(config: FleetConfig, path: Path, given: set[str]) -> dict[str, Any]:
    """`corral up`'s parameter values that the file sets, by parameter name."""
    values: dict[str, Any] = {}
    plain = {"port", "host", "model", "drain_timeout", "startup_timeout", "stop_grace"}
    for name in plain & given:
        values[name] = getattr(config, name)
    if "gate" in given:
        values["no_gate"] = not config.gate
    if "sleep_mode" in given:
        values["no_sleep_mode"] = not config.sleep_mode
    if "engines" in given:
        values["engines"] = config.engines.count
        values["prefill"] = config.engines.prefill
        values["decode"] = config.engines.decode
        values["group_size"] = config.engines.group_size
    if "router" in given:
        router = config.router
        values["policy"] = router.policy
        args = list(router.args)
        if router.slow_start_seconds is not None:
            args.append(f"--slow-start-seconds={router.slow_start_seconds}")
        if router.workers is not None:
            args.append(f"--workers={router.workers}")
        if router.policy_config is not None:
            args.append(f"--policy-config={path.parent / router.policy_config}")
        values["router_args"] = tuple(args)
    return values
