"""PRECHECK's artifact identity: what the engine command will serve (model, revisions, chat template,
dtype, quantization, load format, vLLM version, image, model files, GPUs), read before the start, and
its fingerprint — the same value the READY bundle fingerprint (`checks/bundle.py`) will have when the
engine reports what it was started as. Floating revisions and unexpected fingerprints are refused.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.engine.flags import flag_value, serving_settings
from corral.engine.revisions import floating_revisions as revision_floats
from corral.engine.sim_version import SIM_VLLM_VERSION
from corral.supervisor.checks.bundle import bundle_from
from corral.supervisor.precheck.check import CheckResult, Outcome
from corral.supervisor.precheck.explain import Step, step_lines

NAME = "artifact_identity"
VERSION_TIMEOUT_S = 10.0
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_IMAGE_VERSION = re.compile(r"^v?(\d+\.\d+(?:\.\d+)?(?:[.+-][\w.]+)?)$")
_ASK_VLLM_VERSION = "import importlib.metadata as m; print(m.version('vllm'))"


class EngineKind:
    SIM = "corral_sim"
    VLLM = "vllm"
    OTHER = "other"


class ModelKind:
    LOCAL_DIR = "local_dir"
    HUB = "hub"
    SIMULATED = "simulated"  # a `corral sim --model NAME` with a bare name: nothing to download
    NONE = "none"


def engine_kind(argv: Sequence[str]) -> str:
    """`corral sim …` (or `python -m corral sim …`), `vllm …` (or `python -m vllm…`), or other."""
    names = [Path(a).name for a in argv[:4]]
    for i, name in enumerate(names[:-1]):
        if name == "corral" and names[i + 1] == "sim":
            return EngineKind.SIM
    if names and names[0] == "vllm":
        return EngineKind.VLLM
    if len(argv) > 2 and argv[1] == "-m" and argv[2].split(".")[0] == "vllm":
        return EngineKind.VLLM
    return EngineKind.OTHER


def model_kind(model: str | None, kind: str) -> str:
    """A directory is local; for the simulator only an `owner/name` is a hub reference, for vLLM
    anything that is not a directory is one (the hub also has root-level names such as `gpt2`)."""
    if not model:
        return ModelKind.NONE
    if Path(model).is_dir():
        return ModelKind.LOCAL_DIR
    if kind == EngineKind.SIM and not _HUB_ID.match(model):
        return ModelKind.SIMULATED
    return ModelKind.HUB


def floating_revisions(settings: Mapping[str, Any], kind: str) -> list[str]:
    """What floats in a hub model's command (`corral.engine.revisions`); nothing for a local or
    simulated model."""
    return revision_floats(settings) if kind == ModelKind.HUB else []


def _interpreter(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The Python that runs a vLLM command: `python -m vllm…` names it, a `vllm` script's shebang does."""
    if len(argv) > 2 and argv[1] == "-m":
        return argv[0]
    script = shutil.which(argv[0], path=env.get("PATH")) if argv else None
    if script is None:
        return None
    try:
        with open(script, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode(errors="replace").split()
    if not parts:
        return None
    if Path(parts[0]).name == "env" and len(parts) > 1:
        return shutil.which(parts[1], path=env.get("PATH"))
    return parts[0]


def image_version(image: str | None) -> str | None:
    """The version in an image tag (`vllm/vllm-openai:v0.11.0` → 0.11.0); None for `latest` and the like."""
    if not image or ":" not in image.rsplit("/", 1)[-1]:
        return None
    match = _IMAGE_VERSION.match(image.rsplit(":", 1)[1].split("@", 1)[0])
    return match.group(1) if match else None


def ask_interpreter(python: str, script: str, env: Mapping[str, str], timeout: float) -> bytes | None:
    """What `python -c script` prints, or None when it cannot run, fails or outlives `timeout` (the
    engine's own interpreter, asked about its installation). Blocking."""
    try:
        done = subprocess.run(
            [python, "-c", script], env=dict(env), capture_output=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def engine_version(
    argv: Sequence[str], env: Mapping[str, str], timeout: float = VERSION_TIMEOUT_S
) -> tuple[str | None, str]:
    """The vLLM version the command will run and where it was read: the simulator's --version-string,
    the engine interpreter's installed `vllm` (asked with a timeout), else the image tag. Blocking."""
    kind = engine_kind(argv)
    if kind == EngineKind.SIM:
        given = flag_value(argv, "--version-string")
        return (given, "--version-string") if given else (SIM_VLLM_VERSION, "corral sim default")
    if kind == EngineKind.VLLM and (python := _interpreter(argv, env)) is not None:
        answer = ask_interpreter(python, _ASK_VLLM_VERSION, env, timeout)
        if answer is not None and answer.strip():
            return answer.decode().strip(), f"importlib.metadata in {python}"
    tagged = image_version(env.get("CORRAL_IMAGE"))
    if tagged is not None:
        return tagged, "image tag ($CORRAL_IMAGE)"
    return None, "not known (no vLLM installation to ask, no version in $CORRAL_IMAGE)"


def predicted_models(settings: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What `/v1/models` will list as base models: --served-model-name, else the model as given."""
    name = settings.get("served_model_name") or settings.get("model")
    return [{"id": name}] if isinstance(name, str) else []


@dataclass(frozen=True)
class Artifact:
    """What the command will serve, and its fingerprint (= the READY bundle's, when the engine
    reports the version and models predicted here)."""

    engine: str
    model_kind: str
    version: str | None
    version_source: str
    image: str | None
    hardware: dict[str, Any] | None
    fingerprint: str
    parts: dict[str, Any]

    @property
    def model_files_digest(self) -> str | None:
        files = self.parts.get("model_files")
        return str(files["digest"]) if isinstance(files, dict) else None

    def to_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "engine": self.engine,
            "model_kind": self.model_kind,
            "engine_version": self.version,
            "version_source": self.version_source,
            "image": self.image,
            "hardware": self.hardware,
            "command": self.parts.get("command"),
            "model_files": self.parts.get("model_files"),
        }


def read_artifact(
    argv: Sequence[str],
    env: Mapping[str, str],
    hardware: dict[str, Any] | None = None,
    preload: Sequence[str] = (),
) -> Artifact:
    """The artifact of an engine command (blocking: may ask an interpreter and read model files).
    A bare simulated model costs nothing: no subprocess, no file read."""
    kind = engine_kind(argv)
    version, source = engine_version(argv, env)
    image = env.get("CORRAL_IMAGE")
    settings = serving_settings(argv)
    bundle = bundle_from(argv, version, predicted_models(settings), image, hardware, preload)
    model = settings.get("model")
    return Artifact(
        engine=kind,
        model_kind=model_kind(model if isinstance(model, str) else None, kind),
        version=version,
        version_source=source,
        image=image,
        hardware=hardware,
        fingerprint=bundle.fingerprint,
        parts=bundle.parts,
    )


@dataclass(frozen=True)
class IdentityExpectations:
    allow_floating_revision: bool = False
    expect_fingerprint: str | None = None  # from --expect-fingerprint or a bundle file's fingerprint:
    expect_fingerprint_from: str = "--expect-fingerprint"
    expect_checkpoint_digest: str | None = None


def _lines(artifact: Artifact, floating: list[str]) -> list[str]:
    command = artifact.parts.get("command") or {}
    files = artifact.parts.get("model_files")
    hardware = artifact.hardware
    revision = command.get("revision") or "-"
    steps = [
        Step("fingerprint", artifact.fingerprint, "sha256 of image, version, served models, command, files"),
        Step("model", artifact.model_kind, str(command.get("model"))),
        Step(
            "revision", str(revision), "floating: " + ", ".join(floating) if floating else "pinned or local"
        ),
        Step("vLLM version", artifact.version or "?", artifact.version_source),
        Step("image", artifact.image or "-", "$CORRAL_IMAGE"),
        Step(
            "model files",
            str(files["digest"]) if isinstance(files, dict) else "-",
            f"{files['files']} files, {files['method']}" if isinstance(files, dict) else "no local directory",
        ),
        Step(
            "GPUs",
            f"{hardware['gpu_count']} × {hardware['gpu_model']}" if hardware else "-",
            "from the parallel identity's inventory" if hardware else "not in the fingerprint (not known)",
        ),
    ]
    return step_lines(steps)


def check_identity(artifact: Artifact, expect: IdentityExpectations) -> CheckResult:
    """Refuses a floating revision (unless allowed), a fingerprint or checkpoint digest that is not
    the expected one; passes with the fingerprint otherwise."""
    evidence = artifact.to_json()
    command = artifact.parts.get("command") or {}
    floating = floating_revisions(command, artifact.model_kind)
    evidence["floating"] = floating
    evidence["lines"] = _lines(artifact, floating)
    refusals: list[str] = []
    if floating and not expect.allow_floating_revision:
        refusals.append(
            f"hub model {command.get('model')!r} has a floating revision ({', '.join(floating)}): "
            "pin a 40-hex commit with --revision, or pass --allow-floating-revision"
        )
    if expect.expect_fingerprint is not None and expect.expect_fingerprint != artifact.fingerprint:
        refusals.append(
            f"fingerprint {artifact.fingerprint} is not the expected {expect.expect_fingerprint} "
            f"({expect.expect_fingerprint_from}): the command, version, image or model files differ"
        )
    if expect.expect_checkpoint_digest is not None:
        evidence["expected_checkpoint_digest"] = expect.expect_checkpoint_digest
        actual = artifact.model_files_digest
        if actual is None:
            refusals.append(
                f"--expect-checkpoint-digest {expect.expect_checkpoint_digest}: the model "
                f"{command.get('model')!r} is not a local directory, so there is no digest to compare"
            )
        elif actual != expect.expect_checkpoint_digest:
            refusals.append(
                f"model files digest {actual} is not the expected {expect.expect_checkpoint_digest}: "
                "the checkpoint on disk is not the one this start was authorized for"
            )
    if refusals:
        return CheckResult(NAME, Outcome.REFUSED, "; ".join(refusals), evidence)
    note = f" (floating allowed: {', '.join(floating)})" if floating else ""
    return CheckResult(
        NAME,
        Outcome.PASSED,
        f"fingerprint {artifact.fingerprint}, {artifact.model_kind} model {command.get('model')!r}, "
        f"vLLM {artifact.version or 'version unknown'}{note}",
        evidence,
    )


def merged_env(engine_env: Sequence[tuple[str, str]]) -> dict[str, str]:
    """The environment the engine will get: ours, with the configured (bundle) variables over it."""
    return {**os.environ, **dict(engine_env)}
