"""A named bundle: how to start an engine of it. `corral rollout --to bundle.yaml` moves a fleet to
one; `corral supervise --bundle FILE` declares one a host may be switched to.

    name: vllm-0.33.1
    command: ["/opt/vllm-0.33.1/bin/vllm", "serve", "/models/llama"]   # optional: replaces the engine
                                                                       # command (hosts only)
    engine_args: ["--max-model-len", "8192"]      # added to the engine command
    env: {CORRAL_IMAGE: "registry.local/vllm:0.33.1"}
    preload_command: ["/opt/vllm-0.33.1/bin/vllm", "preload", "--model", "/models/llama",
                      "--weight-cache-health-port", "8100"]   # optional: this bundle's weight-cache
                                                               # daemon (hosts run with --preload-command)
    fingerprint: 3f2a9c0d1e4b5a67     # optional: PRECHECK refuses a start of this bundle with another one

The supervisor's bundle fingerprint (corral.supervisor.checks.bundle) is what identifies a running bundle;
this file only says how to start one. Two bundles that start the same engine get the same fingerprint,
whatever their names; a bundle's preload daemon is part of it (its command is one of the fingerprint's
parts), so two bundles whose daemons differ differ too.

`preload_command` is the daemon of that bundle, on the same vLLM as its engine: a switch to the bundle
stops the engine, then the old daemon, starts this one and waits for its health (its cache rebuilt
under the new version) before the engine starts from it (`corral.supervisor.lifecycle.preload_swap`).
It answers on the host's `--preload-health` URL; without it the host's `--preload-command` runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from corral.redaction import MASK, redact_argv, redact_env, refused_flag
from corral.yaml_file import YamlFileError, read_yaml_file

# set by the fleet for each engine it starts; a bundle that set them would collide with it
_FLEET_OWNED = ("--host", "--port", "--seed")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")


def _no_secret_flag(args: tuple[str, ...]) -> tuple[str, ...]:
    """Refuses a flag whose value is a secret (`--hf-token TOKEN`): records and state show a bundle's
    arguments. The message names the flag, never the value."""
    refused = refused_flag(args)
    if refused is not None:
        raise ValueError(f"{refused[0]} with a value is refused: {refused[1]}")
    return args


class BundleError(ValueError):
    """A bundle file is unreadable or invalid; the message names the file, the field and the fix."""


class BundleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="What people call this bundle; shown in status and change records.")
    command: tuple[str, ...] = Field(default=(), description="Replaces the engine command (hosts only).")
    engine_args: tuple[str, ...] = Field(default=(), description="Added to every engine's command.")
    env: dict[str, str] = Field(default_factory=dict, description="Set in every engine's environment.")
    preload_command: tuple[str, ...] = Field(
        default=(),
        description="This bundle's weight-cache daemon (hosts started with --preload-command); it must "
        "answer on the host's --preload-health URL.",
    )
    fingerprint: str | None = Field(
        default=None,
        description="The fingerprint a start of this bundle must have (what `corral status` showed); "
        "PRECHECK refuses another.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r}: use letters, digits, '.', '_' or '-' (at most 63)")
        return value

    @field_validator("fingerprint")
    @classmethod
    def _fingerprint(cls, value: str | None) -> str | None:
        if value is not None and not _FINGERPRINT.match(value):
            raise ValueError(f"{value!r}: a fingerprint is 16 hex digits, as `corral status` shows it")
        return value

    @field_validator("engine_args")
    @classmethod
    def _engine_args(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arg in value:
            if arg.split("=", 1)[0] in _FLEET_OWNED:
                raise ValueError(f"{arg!r}: the fleet sets {', '.join(_FLEET_OWNED)} for each engine")
        return _no_secret_flag(value)

    @field_validator("command")
    @classmethod
    def _command(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _no_secret_flag(value)

    @field_validator("preload_command")
    @classmethod
    def _preload_command(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if value and not value[0].strip():
            raise ValueError(f"{value[0]!r}: the first word is the daemon's program, e.g. vllm")
        for word in value:
            if "\0" in word:
                raise ValueError(f"{word!r}: a NUL byte cannot be part of a command word")
        pairs = zip(value, (*value[1:], ""), strict=True)
        if any(w == "--load-format=ipc_cache" or (w, n) == ("--load-format", "ipc_cache") for w, n in pairs):
            raise ValueError(
                "--load-format ipc_cache: the daemon loads the weights from disk; only its engine "
                "takes them from the cache"
            )
        return _no_secret_flag(value)

    def preload_argv(self, base: tuple[str, ...]) -> tuple[str, ...]:
        """The daemon of this bundle, given the host's --preload-command."""
        return self.preload_command or base

    def argv(self, base: tuple[str, ...]) -> tuple[str, ...]:
        """The engine command of this bundle, given the command the engine was configured with."""
        return (*(self.command or base), *self.engine_args)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self.name,
            "engine_args": list(self.engine_args),
            "env": dict(self.env),
        }
        if self.command:
            body["command"] = list(self.command)
        if self.preload_command:
            body["preload_command"] = list(self.preload_command)
        if self.fingerprint is not None:
            body["fingerprint"] = self.fingerprint
        return body


def bundle_record(bundle: BundleSpec) -> dict[str, Any]:
    """A bundle as change and rollout records keep it: its JSON with every secret masked (the values of
    secret environment names, secrets in its arguments; `corral.redaction`). Other values stay, so a
    rollback from the record starts the same engines; one that held a secret is refused by
    `unrecorded_secrets`."""
    body = bundle.to_json()
    body["engine_args"] = redact_argv(bundle.engine_args)
    body["env"] = redact_env(bundle.env)
    if bundle.command:
        body["command"] = redact_argv(bundle.command)
    if bundle.preload_command:
        body["preload_command"] = redact_argv(bundle.preload_command)
    return body


def unrecorded_secrets(bundle: BundleSpec) -> list[str]:
    """What a record masked in a bundle read back from it (`bundle_record`): the environment names, and
    `engine_args` or `command` when a secret in them was; such a bundle cannot start an engine."""
    masked = sorted(name for name, value in bundle.env.items() if value == MASK)
    for part in ("engine_args", "command", "preload_command"):
        if any(MASK in arg for arg in getattr(bundle, part)):
            masked.append(part)
    return masked


def bundle_from_json(body: Any, where: str) -> BundleSpec:
    try:
        return BundleSpec.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {_plain(err)}" for err in exc.errors()
        )
        raise BundleError(f"{where}: {problems}") from None


# what a wrong type answers, in the words of the file rather than the validator's
_WANTED = {
    "tuple_type": 'a list of strings, e.g. ["--max-model-len", "8192"]',
    "list_type": 'a list of strings, e.g. ["--max-model-len", "8192"]',
    "dict_type": "a mapping of names to strings, e.g. {CORRAL_IMAGE: img:2}",
    "string_type": "a string (quote it if YAML reads it as a number or true/false)",
}


def _plain(err: Any) -> str:
    wanted = _WANTED.get(err["type"])
    if wanted is None:
        return str(err["msg"])
    return f"write {wanted}; it is {err['input']!r}"


def load_bundle(path: Path) -> BundleSpec:
    try:
        body = read_yaml_file(path, "bundle")
    except YamlFileError as exc:
        raise BundleError(str(exc)) from None
    if not isinstance(body, dict):
        raise BundleError(f"{path}: write a mapping with name, engine_args and env")
    return bundle_from_json(body, str(path))
