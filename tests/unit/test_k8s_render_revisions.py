"""A hub model in `corral k8s render` is pinned or explicitly floating: `model.revision` (a 40-hex
commit) becomes the engine's `--revision`, `model.allow_floating_revision` the supervisor's
`--allow-floating-revision`, `supervisor.expect_fingerprint` its `--expect-fingerprint`, and a config
whose pods PRECHECK would refuse fails at render time, naming the field and both fixes. The rendered
command is parsed by the real `corral supervise` CLI and judged by PRECHECK's own identity check."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from corral.cli import main
from corral.k8s.render.config_reading import ConfigError
from corral.supervisor.cli import run_command as supervise_run_command
from corral.supervisor.precheck.check import Outcome
from corral.supervisor.precheck.identity import IdentityExpectations, check_identity, read_artifact
from tests.unit.test_k8s_render_manifests import (
    HUB_COMMIT,
    KUBERNETES,
    _parse,
    build,
    engine_container,
    seed,
    variant,
)

# the engine's environment as PRECHECK reads it here: no vLLM to ask its version, no image tag
NO_VLLM = {"PATH": "/nonexistent"}


def hub(**model: Any) -> dict[str, Any]:
    """The variant (`Qwen/Qwen2.5-72B-Instruct`, a hub id) with its model section replaced by `model`."""
    data = variant()
    base = {k: v for k, v in data["model"].items() if k not in ("revision", "allow_floating_revision")}
    data["model"] = {**base, **model}
    return data


def supervise_params(data: dict[str, Any]) -> dict[str, Any]:
    """What `corral supervise run` reads from the rendered entrypoint."""
    _, _, manifests = build(data)
    command = engine_container(manifests)["command"]
    assert command[:3] == ["corral", "supervise", "run"]
    return _parse(supervise_run_command, command[3:])


def identity_verdict(params: dict[str, Any]) -> Any:
    """PRECHECK's artifact identity of the rendered engine command, with the rendered expectations."""
    expect = IdentityExpectations(
        allow_floating_revision=params["allow_floating_revision"],
        expect_fingerprint=params["expect_fingerprint"],
    )
    return check_identity(read_artifact(params["engine_command"], NO_VLLM), expect)


def problem_of(data: dict[str, Any]) -> Any:
    with pytest.raises(ConfigError) as caught:
        build(data)
    [problem] = caught.value.problems
    return problem


def test_a_pinned_commit_is_the_engines_revision_and_precheck_passes_it() -> None:
    params = supervise_params(hub(revision=HUB_COMMIT))
    engine = params["engine_command"]
    assert list(engine[:3]) == ["vllm", "serve", "Qwen/Qwen2.5-72B-Instruct"]
    assert engine[engine.index("--revision") + 1] == HUB_COMMIT
    assert params["allow_floating_revision"] is False
    verdict = identity_verdict(params)
    assert verdict.outcome is Outcome.PASSED, verdict.reason
    assert verdict.evidence["floating"] == []


def test_the_api_server_launcher_carries_the_revision_too() -> None:
    data = hub(revision=HUB_COMMIT)
    data["engine"]["launcher"] = "api-server"
    engine = supervise_params(data)["engine_command"]
    assert list(engine[:4]) == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert engine[engine.index("--revision") + 1] == HUB_COMMIT


@pytest.mark.parametrize("revision", [None, "main", "v2.5"])
def test_allow_floating_revision_is_the_supervisors_flag_and_precheck_needs_it(revision: str | None) -> None:
    model: dict[str, Any] = {"allow_floating_revision": True}
    if revision is not None:
        model["revision"] = revision
    params = supervise_params(hub(**model))
    assert params["allow_floating_revision"] is True
    verdict = identity_verdict(params)
    assert verdict.outcome is Outcome.PASSED and "floating allowed" in verdict.reason
    # without the rendered flag, the pod's PRECHECK would refuse the same command
    refused = identity_verdict({**params, "allow_floating_revision": False})
    assert refused.outcome is Outcome.REFUSED and "floating revision" in refused.reason


def test_a_hub_id_without_a_revision_is_refused_at_render_naming_both_fixes() -> None:
    problem = problem_of(hub())
    assert problem.field == "model.revision"
    assert "'Qwen/Qwen2.5-72B-Instruct' is a hub id" in problem.message
    assert "40-hex commit" in problem.message and "model.allow_floating_revision: true" in problem.message


@pytest.mark.parametrize("revision", ["main", "v1.0", HUB_COMMIT[:12], HUB_COMMIT.upper()])
def test_a_branch_or_tag_revision_is_refused_at_render(revision: str) -> None:
    problem = problem_of(hub(revision=revision))
    assert (problem.field, problem.value) == ("model.revision", revision)
    assert "branch or tag" in problem.message and "model.allow_floating_revision: true" in problem.message


@pytest.mark.parametrize(
    ("section", "args", "field"),
    [
        ("engine", ["--tokenizer-revision", "main"], "engine.args"),
        ("engine", ["--code-revision=dev"], "engine.args"),
        ("rollback", ["--tokenizer-revision", "v1"], "supervisor.rollback_bundle.engine_args"),
    ],
)
def test_a_floating_tokenizer_or_code_revision_is_refused_at_render(
    section: str, args: list[str], field: str
) -> None:
    data = hub(revision=HUB_COMMIT)
    if section == "engine":
        data["engine"]["args"] = args
    else:
        data["supervisor"] = {"rollback_bundle": {"name": "previous", "engine_args": args}}
    problem = problem_of(data)
    assert problem.field == field and "pin --" in problem.message
    # the same config renders once floating is allowed
    data["model"]["allow_floating_revision"] = True
    assert supervise_params(data)["allow_floating_revision"] is True


@pytest.mark.parametrize("arg", [["--revision", HUB_COMMIT], [f"--revision={HUB_COMMIT}"]])
def test_revision_in_engine_args_is_refused(arg: list[str]) -> None:
    data = hub(revision=HUB_COMMIT)
    data["engine"]["args"] = arg
    problem = problem_of(data)
    assert problem.field == "engine.args" and "set it with model.revision" in problem.message


def test_a_local_directory_needs_no_revision_and_renders_no_flags() -> None:
    params = supervise_params(seed())
    assert "--revision" not in params["engine_command"]
    assert (params["allow_floating_revision"], params["expect_fingerprint"]) == (False, None)


def test_expect_fingerprint_is_the_supervisors_flag_and_precheck_compares_it() -> None:
    pinned = hub(revision=HUB_COMMIT)
    fingerprint = identity_verdict(supervise_params(pinned)).evidence["fingerprint"]
    right = copy.deepcopy(pinned)
    right["supervisor"] = {"expect_fingerprint": fingerprint}
    params = supervise_params(right)
    assert params["expect_fingerprint"] == fingerprint
    assert identity_verdict(params).outcome is Outcome.PASSED
    wrong = copy.deepcopy(pinned)
    wrong["supervisor"] = {"expect_fingerprint": "0" * 16 if fingerprint != "0" * 16 else "1" * 16}
    verdict = identity_verdict(supervise_params(wrong))
    assert verdict.outcome is Outcome.REFUSED and "is not the expected" in verdict.reason


def test_a_malformed_expected_fingerprint_is_refused() -> None:
    data = hub(revision=HUB_COMMIT)
    data["supervisor"] = {"expect_fingerprint": "sha256:abc"}
    problem = problem_of(data)
    assert problem.field == "supervisor.expect_fingerprint" and "16 hex digits" in problem.message


def test_rendered_objects_with_the_new_fields_validate_against_the_schema() -> None:
    data = hub(revision="main", allow_floating_revision=True)
    data["supervisor"] = {"expect_fingerprint": "0123456789abcdef"}
    _, _, manifests = build(data)
    for m in manifests:
        kubernetes_validate.validate(yaml.safe_load(yaml.safe_dump(m.obj)), KUBERNETES, strict=True)


def test_cli_exits_2_on_an_unpinned_hub_model_and_writes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "corral.yaml"
    config.write_text(yaml.safe_dump(hub()), encoding="utf-8")
    out = tmp_path / "rendered"
    result = CliRunner().invoke(main, ["k8s", "render", "--config", str(config), "--out", str(out)])
    assert result.exit_code == 2
    # the refusal is the contract: one line naming the value and what to do
    assert "model.revision: (missing):" in result.stderr and "allow_floating_revision" in result.stderr
    assert not out.exists()
