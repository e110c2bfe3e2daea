"""`supervisor.on_startup_failure` in `corral k8s render`: rendered as the supervisor's flag (parsed by
the real CLI), the rollback bundle as a ConfigMap file the pod declares with `--bundle` (the very file
`corral supervise` loads), probes that cannot undo the strategy, and bad configs named field by field."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from corral.bundle_spec import load_bundle
from corral.k8s.render.config_reading import ConfigError
from corral.supervisor.cli import run_command as supervise_run_command
from tests.unit.test_k8s_render_manifests import (
    KUBERNETES,
    _parse,
    build,
    by_file,
    engine_container,
    seed,
)

ROLLBACK = {
    "name": "previous",
    "engine_args": ["--max-model-len", "4096"],
    "env": {"VLLM_LOGGING_LEVEL": "INFO"},
}


def with_supervisor(**supervisor: Any) -> dict[str, Any]:
    data = copy.deepcopy(seed())
    data.setdefault("supervisor", {}).update(supervisor)
    return data


def strategy_flags(command: list[str]) -> list[str]:
    before_engine = command[: command.index("--")]
    return [
        value
        for flag, value in itertools.pairwise(before_engine)
        if flag in ("--on-startup-failure", "--bundle")
    ]


def test_restart_is_the_default_and_renders_no_flag() -> None:
    _, _, manifests = build(seed())
    command = engine_container(manifests)["command"]
    assert strategy_flags(command) == []
    assert "engine-bundles-configmap.yaml" not in by_file(manifests)
    assert _parse(supervise_run_command, command[3:])["on_startup_failure"] == "restart"


def test_stay_unready_is_rendered_and_the_probes_are_the_supervisors() -> None:
    _, budgets, manifests = build(with_supervisor(on_startup_failure="stay-unready"))
    container = engine_container(manifests)
    params = _parse(supervise_run_command, container["command"][3:])
    assert params["on_startup_failure"] == "stay-unready"
    # the supervisor answers /livez and /startupz 200 once held: the probes stay on them, and no
    # failureThreshold of theirs can restart a held pod (the integration test holds the 200s)
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["startupProbe"]["httpGet"]["path"] == "/startupz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    _, base, _ = build(seed())
    assert budgets.startup_window == base.startup_window


def test_rollback_declares_its_bundle_from_a_configmap_the_supervisor_reads(tmp_path: Path) -> None:
    config, _, manifests = build(with_supervisor(on_startup_failure="rollback", rollback_bundle=ROLLBACK))
    files = by_file(manifests)
    container = engine_container(manifests)
    command = container["command"]
    assert strategy_flags(command) == ["/etc/corral/bundles/previous.yaml", "rollback=previous"]
    params = _parse(supervise_run_command, command[3:])
    assert params["on_startup_failure"] == "rollback=previous"
    assert params["bundle_files"] == (Path("/etc/corral/bundles/previous.yaml"),)
    config_map = files["engine-bundles-configmap.yaml"]
    # the file as mounted is what `corral supervise --bundle` loads
    (tmp_path / "previous.yaml").write_text(config_map["data"]["previous.yaml"])
    bundle = load_bundle(tmp_path / "previous.yaml")
    assert (bundle.name, list(bundle.engine_args), bundle.env) == (
        "previous",
        ROLLBACK["engine_args"],
        ROLLBACK["env"],
    )
    pod = files["engine-deployment.yaml"]["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount == {"name": volume["name"], "mountPath": "/etc/corral/bundles", "readOnly": True}
    # ConfigMaps are applied before the pods that mount them
    assert list(files).index("engine-bundles-configmap.yaml") < list(files).index("engine-deployment.yaml")
    for m in manifests:
        kubernetes_validate.validate(yaml.safe_load(yaml.safe_dump(m.obj)), KUBERNETES, strict=True)
    assert config.supervisor.rollback_bundle is not None


def test_a_rollback_doubles_the_startup_window_the_startup_probe_covers() -> None:
    _, base, _ = build(seed())
    _, budgets, manifests = build(with_supervisor(on_startup_failure="rollback", rollback_bundle=ROLLBACK))
    assert budgets.startup_window == 2 * base.startup_window
    startup = engine_container(manifests)["startupProbe"]
    assert (startup["failureThreshold"] - 1) * startup["periodSeconds"] >= budgets.startup_window
    assert any(step.name == "startup window, rollback" for step in budgets.steps)


def test_a_declared_bundle_without_rollback_is_still_declared() -> None:
    _, _, manifests = build(with_supervisor(on_startup_failure="stay-unready", rollback_bundle=ROLLBACK))
    assert strategy_flags(engine_container(manifests)["command"]) == [
        "/etc/corral/bundles/previous.yaml",
        "stay-unready",
    ]


@pytest.mark.parametrize(
    ("supervisor", "field", "says"),
    [
        ({"on_startup_failure": "rollback"}, "supervisor.rollback_bundle", "needs the bundle"),
        ({"on_startup_failure": "retry"}, "supervisor.on_startup_failure", "restart"),
        (
            {"on_startup_failure": "rollback", "rollback_bundle": {**ROLLBACK, "name": "initial"}},
            "supervisor.rollback_bundle.name",
            "rendered engine command's own",
        ),
        (
            {"rollback_bundle": {**ROLLBACK, "engine_args": ["--port", "9"]}},
            "supervisor.rollback_bundle.engine_args",
            "set by the renderer",
        ),
        (
            {"rollback_bundle": {**ROLLBACK, "env": {"HF_TOKEN": "hf_x"}}},
            "supervisor.rollback_bundle.env",
            "looks like a secret",
        ),
        ({"rollback_bundle": {**ROLLBACK, "command": ["vllm"]}}, "supervisor.rollback_bundle.command", ""),
    ],
)
def test_bad_strategy_configs_name_the_field(supervisor: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build(with_supervisor(**supervisor))
    [problem] = caught.value.problems
    assert problem.field == field and says in problem.message
