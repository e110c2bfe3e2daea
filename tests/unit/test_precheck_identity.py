"""PRECHECK's artifact identity: floating revisions refused unless allowed, a pinned commit passes, a
simulated model is no hub reference, the fingerprint is the READY bundle's, and an expected
fingerprint or checkpoint digest that differs is refused with both values."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from corral.supervisor.checks.bundle import bundle_from
from corral.supervisor.precheck.check import CheckResult, Outcome
from corral.supervisor.precheck.identity import (
    EngineKind,
    IdentityExpectations,
    ModelKind,
    check_identity,
    engine_kind,
    engine_version,
    image_version,
    read_artifact,
)
from tests.support.model_dirs import make_model_dir

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SIM = (sys.executable, "-m", "corral", "sim", "--port", "8000")


def vllm(*args: str) -> tuple[str, ...]:
    # a `vllm` the version question cannot reach (no such interpreter): the version is "not known"
    return ("/nonexistent/bin/vllm", "serve", *args)


def identity(argv: tuple[str, ...], expect: IdentityExpectations | None = None, **env: str) -> CheckResult:
    return check_identity(read_artifact(argv, env), expect or IdentityExpectations())


def test_engine_kinds() -> None:
    assert engine_kind(SIM) == EngineKind.SIM
    assert engine_kind(("corral", "sim", "--model", "m")) == EngineKind.SIM
    assert engine_kind(("vllm", "serve", "m")) == EngineKind.VLLM
    assert engine_kind(("/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server")) == EngineKind.VLLM
    assert engine_kind(("python", "server.py")) == EngineKind.OTHER


@pytest.mark.parametrize(
    ("args", "floating"),
    [
        (("meta-llama/Llama-3.1-8B",), ["--revision (none given)"]),
        (("meta-llama/Llama-3.1-8B", "--revision", "main"), ["--revision main"]),
        (("meta-llama/Llama-3.1-8B", "--revision", "v1.0"), ["--revision v1.0"]),  # tags move
        (("gpt2",), ["--revision (none given)"]),  # a root-level hub name, for vLLM
        (
            ("org/m", "--revision", COMMIT, "--tokenizer-revision", "main"),
            ["--tokenizer-revision main"],
        ),
    ],
)
def test_a_floating_revision_is_refused_naming_the_flag(args: tuple[str, ...], floating: list[str]) -> None:
    result = identity(vllm(*args))
    assert result.outcome is Outcome.REFUSED
    assert result.evidence["floating"] == floating
    assert floating[0] in result.reason and "--allow-floating-revision" in result.reason


def test_a_floating_revision_passes_when_allowed_and_says_so() -> None:
    result = identity(vllm("org/m", "--revision", "main"), IdentityExpectations(allow_floating_revision=True))
    assert result.outcome is Outcome.PASSED
    assert "floating allowed: --revision main" in result.reason


def test_a_pinned_commit_passes() -> None:
    result = identity(vllm("org/m", "--revision", COMMIT))
    assert result.outcome is Outcome.PASSED, result.reason
    assert result.evidence["model_kind"] == ModelKind.HUB


def test_a_simulated_bare_name_is_no_hub_reference_and_costs_nothing() -> None:
    result = identity((*SIM, "--model", "sim-model"))
    assert result.outcome is Outcome.PASSED, result.reason
    assert result.evidence["model_kind"] == ModelKind.SIMULATED
    assert result.evidence["model_files"] is None
    # an owner/name given to the simulator stands for a hub model, and floats like one
    assert identity((*SIM, "--model", "org/m")).outcome is Outcome.REFUSED


def test_a_local_directory_is_pinned_by_its_files(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m", weights_bytes=1 << 20)
    result = identity(vllm(str(model)))
    assert result.outcome is Outcome.PASSED, result.reason
    assert result.evidence["model_kind"] == ModelKind.LOCAL_DIR
    assert result.evidence["model_files"]["files"] == 3


def test_the_fingerprint_is_the_ready_bundles_when_the_engine_reports_what_was_predicted(
    tmp_path: Path,
) -> None:
    model = make_model_dir(tmp_path / "m", weights_bytes=1 << 20)
    argv = (*SIM, "--model", str(model), "--served-model-name", "m", "--version-string", "0.40.1")
    artifact = read_artifact(argv, {"CORRAL_IMAGE": "reg/vllm:0.40.1"})
    ready = bundle_from(argv, "0.40.1", [{"id": "m"}], "reg/vllm:0.40.1")
    assert artifact.fingerprint == ready.fingerprint
    assert bundle_from(argv, "0.40.2", [{"id": "m"}], "reg/vllm:0.40.1").fingerprint != artifact.fingerprint


def test_a_fingerprint_mismatch_is_refused_with_both_values() -> None:
    argv = (*SIM, "--model", "sim-model")
    actual = read_artifact(argv, {}).fingerprint
    result = identity(argv, IdentityExpectations(expect_fingerprint="feedfacefeedface"))
    assert result.outcome is Outcome.REFUSED
    assert actual in result.reason and "feedfacefeedface" in result.reason
    assert identity(argv, IdentityExpectations(expect_fingerprint=actual)).outcome is Outcome.PASSED


def test_the_sim_version_string_and_the_gpus_are_part_of_the_fingerprint() -> None:
    a = read_artifact((*SIM, "--model", "m", "--version-string", "1.0"), {})
    b = read_artifact((*SIM, "--model", "m", "--version-string", "1.1"), {})
    assert (a.version, a.version_source) == ("1.0", "--version-string")
    assert a.fingerprint != b.fingerprint
    argv = (*SIM, "--model", "m")
    h100 = read_artifact(argv, {}, {"gpu_model": "H100", "gpu_count": 2}).fingerprint
    assert h100 != read_artifact(argv, {}, {"gpu_model": "A100", "gpu_count": 2}).fingerprint
    assert read_artifact(argv, {}).version == engine_version(argv, {})[0]


def test_a_checkpoint_digest_mismatch_is_refused(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m", weights_bytes=1 << 20)
    argv = vllm(str(model))
    digest = read_artifact(argv, {}).model_files_digest
    assert digest is not None
    assert identity(argv, IdentityExpectations(expect_checkpoint_digest=digest)).outcome is Outcome.PASSED
    (model / "config.json").write_text('{"num_hidden_layers": 1}')
    result = identity(argv, IdentityExpectations(expect_checkpoint_digest=digest))
    assert result.outcome is Outcome.REFUSED
    assert digest in result.reason and "not the expected" in result.reason
    hub = identity(vllm("org/m", "--revision", COMMIT), IdentityExpectations(expect_checkpoint_digest=digest))
    assert hub.outcome is Outcome.REFUSED and "not a local directory" in hub.reason


def test_the_version_is_asked_of_the_engines_interpreter() -> None:
    # this interpreter has no vllm installed: the question fails, and the image tag answers
    argv = (sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "m")
    assert engine_version(argv, {"CORRAL_IMAGE": "vllm/vllm-openai:v0.11.0"}) == (
        "0.11.0",
        "image tag ($CORRAL_IMAGE)",
    )
    assert engine_version(argv, {})[0] is None


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("vllm/vllm-openai:v0.11.0", "0.11.0"),
        ("registry.local:5000/vllm:0.33.1", "0.33.1"),
        ("registry.local:5000/vllm", None),
        ("vllm/vllm-openai:latest", None),
        (None, None),
    ],
)
def test_image_version(image: str | None, version: str | None) -> None:
    assert image_version(image) == version


def test_a_plain_simulator_start_runs_no_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_subprocess(*args: object, **kwargs: object) -> None:
        raise AssertionError("PRECHECK of a plain `corral sim --model NAME` ran a subprocess")

    monkeypatch.setattr("subprocess.run", no_subprocess)
    artifact = read_artifact((*SIM, "--model", "sim-model"), {})
    assert artifact.version_source == "corral sim default" and artifact.parts["model_files"] is None
