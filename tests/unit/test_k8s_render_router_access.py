"""The rendered router after the admin-route lockdown: its probes ask the open `/livez` (a kubelet
probing `/metrics` on a router bound to 0.0.0.0 would get 401 and the pod would never be Ready), its
admin routes answer only with the admin key mounted from a Secret of its own, and when the engines
enforce vLLM's API key (`VLLM_API_KEY` in engine.secret_env) the router mounts the same Secret key
and sends it with its probes and requests."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from corral.cli import main
from corral.k8s.render.config_reading import ConfigError, parse_config
from corral.router.cli import router as router_command
from corral.router.edge.admin_access import OPEN_PATHS
from tests.unit.test_k8s_render_hardening import (
    _parse,
    all_containers,
    engine_pod,
    main_container,
    mount_of,
    router_pod,
    volumes,
)
from tests.unit.test_k8s_render_manifests import KUBERNETES, build, seed, variant

Obj = dict[str, Any]
CASES = [seed(), variant()]
IDS = ["wait-for-kv-cache", "variant"]


def keyed(
    data: dict[str, Any], secret: str = "vllm-key", key: str = "api-key", tenants: bool = True
) -> dict[str, Any]:
    """`data` with the engines enforcing vLLM's API key from a Secret (and, unless `tenants` is False, the
    router's tenants' API keys file from another, which render requires with it)."""
    data = copy.deepcopy(data)
    data.setdefault("engine", {}).setdefault("secret_env", {})
    data["engine"]["secret_env"]["VLLM_API_KEY"] = {"secret_name": secret, "key": key}
    if tenants:
        data.setdefault("router", {})["tenant_keys"] = {"secret_name": "team-keys"}
    return data


def secret_behind(pod: Obj, container: Obj, path: str) -> Obj:
    """The `secret` volume source whose read-only mount in `container` holds `path`."""
    mount = mount_of(container, path)
    assert mount is not None, f"{path} is on no volume"
    assert mount["readOnly"] is True, mount
    source: Obj = volumes(pod)[mount["name"]]["secret"]
    return source


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_router_probes_ask_the_open_livez_not_an_admin_route(data: dict[str, Any]) -> None:
    container = main_container(router_pod(data))
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/livez", probe
        assert get["path"] in OPEN_PATHS  # the router answers it without a key, from anywhere
        assert get["port"] == "http"


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_router_admin_routes_want_a_key_mounted_from_its_own_secret(data: dict[str, Any]) -> None:
    config, _, _ = build(data)
    pod = router_pod(data)
    container = main_container(pod)
    params = _parse(router_command, container["command"][2:])
    assert params["host"] == "0.0.0.0"  # the pod network: so the admin routes must want the key
    assert params["admin_port"] is None
    key_file = str(params["admin_key_file"])
    source = secret_behind(pod, container, key_file)
    assert source["secretName"] == f"{config.name}-corral-router-admin"
    (item,) = source["items"]
    assert key_file.endswith("/" + item["path"])
    assert source["defaultMode"] == 0o440
    # a Secret of its own: the fleet key and the admin key are not one file
    assert key_file != str(params["supervisor_token_key_file"])
    assert source["secretName"] != config.token_secret
    # only the router mounts it
    engine = engine_pod(data)
    assert all(
        v.get("secret", {}).get("secretName") != source["secretName"] for v in engine["spec"]["volumes"]
    )


def test_the_admin_key_secret_and_key_come_from_the_config() -> None:
    data = seed()
    data["router"]["admin_key"] = {"secret_name": "prom-scrape", "key": "router-admin"}
    pod = router_pod(data)
    container = main_container(pod)
    key_file = str(_parse(router_command, container["command"][2:])["admin_key_file"])
    source = secret_behind(pod, container, key_file)
    assert source["secretName"] == "prom-scrape"
    assert source["items"] == [{"key": "router-admin", "path": "router-admin"}]
    assert key_file.endswith("/router-admin")


def test_a_bad_admin_key_secret_name_is_refused_with_the_field_named() -> None:
    data = seed()
    data["router"]["admin_key"] = {"secret_name": "Not_A_Name"}
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert "router.admin_key.secret_name: 'Not_A_Name'" in str(caught.value)


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_router_sends_the_engines_api_key_from_the_same_secret(data: dict[str, Any]) -> None:
    data = keyed(data)
    pod = router_pod(data)
    container = main_container(pod)
    params = _parse(router_command, container["command"][2:])
    key_file = str(params["engine_api_key_file"])
    source = secret_behind(pod, container, key_file)
    assert source["secretName"] == "vllm-key"
    (item,) = source["items"]
    assert item["key"] == "api-key" and key_file.endswith("/" + item["path"])
    # the engine gets it as vLLM reads it, from its environment, never as a value
    env = {e["name"]: e for e in main_container(engine_pod(data))["env"]}
    assert env["VLLM_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "vllm-key", "key": "api-key"}}
    # and the key is nowhere else in the router pod: not in its env, not in its argv
    assert all(e["name"] != "VLLM_API_KEY" for c in all_containers(pod) for e in c.get("env", []))


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_without_an_engine_api_key_the_router_sends_none(data: dict[str, Any]) -> None:
    pod = router_pod(data)
    params = _parse(router_command, main_container(pod)["command"][2:])
    assert params["engine_api_key_file"] is None
    secrets = {v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v}
    config, _, _ = build(data)
    assert secrets == {config.token_secret, f"{config.name}-corral-router-admin"}


@pytest.mark.parametrize("data", [keyed(seed()), keyed(variant())], ids=IDS)
def test_a_router_with_every_key_validates_against_the_kubernetes_schema(data: dict[str, Any]) -> None:
    _, _, manifests = build(data)
    for m in manifests:
        kubernetes_validate.validate(yaml.safe_load(yaml.safe_dump(m.obj)), KUBERNETES, strict=True)


def test_render_says_how_to_create_the_admin_key_secret(tmp_path: Path) -> None:
    config_path = tmp_path / "corral.yaml"
    config_path.write_text(yaml.safe_dump(variant()), encoding="utf-8")
    out = tmp_path / "rendered"
    result = CliRunner().invoke(main, ["k8s", "render", "--config", str(config_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    hint = (
        "kubectl -n inference create secret generic qwen-72b-corral-router-admin "
        '--from-literal=key="$(openssl rand -hex 32)"'
    )
    # the printed answer is the contract: what the person who ran the command reads
    assert hint in result.stderr


def test_the_rendered_router_deployment_names_the_admin_key_secret_it_needs(tmp_path: Path) -> None:
    config_path = tmp_path / "corral.yaml"
    config_path.write_text(yaml.safe_dump(keyed(variant())), encoding="utf-8")
    result = CliRunner().invoke(main, ["k8s", "render", "--config", str(config_path)])
    assert result.exit_code == 0, result.output
    router_doc = next(
        d
        for d in result.stdout.split("---\n")
        if "kind: Deployment\n" in d and "name: qwen-72b-router\n" in d
    )
    assert (
        "# Needs the router's admin key Secret first: kubectl -n inference create secret generic "
        in router_doc
    )
    assert "qwen-72b-corral-router-admin" in router_doc


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_a_keyed_router_answers_only_tenants_from_an_api_keys_file_in_a_secret(data: dict[str, Any]) -> None:
    pod = router_pod(keyed(data))
    container = main_container(pod)
    params = _parse(router_command, container["command"][2:])
    keys_file = str(params["api_keys_file"])
    source = secret_behind(pod, container, keys_file)
    assert source["secretName"] == "team-keys"
    assert source["items"] == [{"key": "tenants.yaml", "path": "tenants.yaml"}]
    assert source["defaultMode"] == 0o440 and keys_file.endswith("/tenants.yaml")
    # only the router mounts it
    engine = engine_pod(keyed(data))
    assert all(v.get("secret", {}).get("secretName") != "team-keys" for v in engine["spec"]["volumes"])


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_render_refuses_a_router_on_the_pod_network_with_the_engines_key_and_no_tenant_keys(
    data: dict[str, Any],
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(keyed(data, tenants=False))
    text = str(caught.value)
    assert "router.tenant_keys: (missing)" in text
    assert "VLLM_API_KEY" in text and "vllm-key" in text and "0.0.0.0" in text
    assert "router.tenant_keys: {secret_name: " in text  # what to write


HF = "hf_renderSecret0123456789"
S3 = "s3-secret-9f8e7d6c5b4a"


@pytest.mark.parametrize(
    "args",
    [
        ["--hf-token", HF],
        [f"--hf-token={HF}"],
        [
            "--load-format",
            "tensorizer",
            "--model-loader-extra-config",
            json.dumps({"s3_secret_access_key": S3}),
        ],
        [
            "--model-loader-extra-config="
            + json.dumps({"tensorizer_uri": "s3://b/m", "c": {"s3_secret_access_key": S3}})
        ],
    ],
    ids=["hf-token", "hf-token=", "loader-json", "loader-json-nested"],
)
def test_render_refuses_a_secret_in_engine_args_and_never_prints_it(args: list[str], tmp_path: Path) -> None:
    data = seed()
    data["engine"]["args"] = args
    config_path = tmp_path / "corral.yaml"
    config_path.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = CliRunner().invoke(
        main, ["k8s", "render", "--config", str(config_path), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code != 0
    assert "engine.args" in result.output and "engine.secret_env" in result.output
    assert HF not in result.output and S3 not in result.output
    assert not any((tmp_path / "o").glob("*.yaml"))


def test_a_plain_secret_in_engine_env_is_refused_without_printing_it() -> None:
    data = seed()
    data["engine"]["env"] = {"HF_TOKEN": HF, "AWS_SECRET_ACCESS_KEY": S3}
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert "engine.secret_env" in str(caught.value)
    assert HF not in str(caught.value) and S3 not in str(caught.value)
