"""`gateway:` in corral.yaml (deploy/examples/gateway-epp): the committed rendering is current; the
InferencePool validates against the v1 CRD schema of the Gateway API Inference Extension (tests/data,
provenance in its $comment) and its CEL rules; the built-in kinds validate with kubernetes-validate; the
picker's ServiceMonitor against the prometheus-operator subset; the picker follows the router's pods
with the router's flags; nothing of it is rendered without the section."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from corral.k8s.render.budgets import derive
from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.config_reading import ConfigError, parse_config
from corral.k8s.render.manifests import render
from corral.k8s.render.output import document

KUBERNETES = "1.30.0"
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "gateway-epp"
DATA = ROOT / "tests" / "data"
POOL_SCHEMA = json.loads((DATA / "inferencepool_v1.schema.json").read_text(encoding="utf-8"))
MONITORING = json.loads((DATA / "prometheus_operator_subset.schema.json").read_text(encoding="utf-8"))
REGENERATE = (
    "corral k8s render --config deploy/examples/gateway-epp/corral.yaml "
    "--out deploy/examples/gateway-epp/rendered"
)
NOT_BUILT_IN = {"InferencePool", "HTTPRoute", "ServiceMonitor"}


def _data() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLE / "corral.yaml").read_text(encoding="utf-8"))
    return loaded


def _objects(config: CorralDeployment) -> dict[str, dict[str, Any]]:
    return {m.filename: m.obj for m in render(config, derive(config))}


def check_pool(pool: dict[str, Any]) -> None:
    """The schema, and the CEL rules jsonschema does not run (x-kubernetes-validations)."""
    jsonschema.validate(pool, POOL_SCHEMA)
    spec = pool["spec"]
    ref = spec["endpointPickerRef"]
    assert ref.get("kind", "Service") != "Service" or "port" in ref, "port is required for a Service"
    numbers = [p["number"] for p in spec["targetPorts"]]
    assert len(numbers) == len(set(numbers)), "port number must be unique"


def test_committed_rendering_is_current() -> None:
    config = parse_config(_data())
    manifests = render(config, derive(config))
    committed = {p.name: p.read_text(encoding="utf-8") for p in sorted((EXAMPLE / "rendered").glob("*.yaml"))}
    assert sorted(committed) == sorted(m.filename for m in manifests), f"stale: run `{REGENERATE}`"
    for m in manifests:
        assert committed[m.filename] == document(config, m), f"{m.filename} is stale: run `{REGENERATE}`"


def test_every_rendered_object_validates() -> None:
    seen = set()
    for path in sorted((EXAMPLE / "rendered").glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            seen.add(obj["kind"])
            if obj["kind"] == "InferencePool":
                check_pool(obj)
            elif obj["kind"] == "ServiceMonitor":
                jsonschema.validate(obj, MONITORING["ServiceMonitor"])
            elif obj["kind"] == "HTTPRoute":
                assert obj["apiVersion"] == "gateway.networking.k8s.io/v1"
            else:
                kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    assert NOT_BUILT_IN <= seen and {"Deployment", "Service", "Role", "RoleBinding", "ServiceAccount"} <= seen


def test_the_pool_schema_refuses_what_the_api_server_would() -> None:
    pool = _objects(parse_config(_data()))["inferencepool.yaml"]
    for broken in (
        {"failureMode": "FailSometimes"},  # not an enum value
        {"port": {"number": 70000}},  # out of range
        {"name": ""},  # too short
    ):
        bad = copy.deepcopy(pool)
        bad["spec"]["endpointPickerRef"].update(broken)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, POOL_SCHEMA)
    bad = copy.deepcopy(pool)
    del bad["spec"]["targetPorts"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, POOL_SCHEMA)


def test_the_picker_reads_the_routers_pods_with_the_routers_flags() -> None:
    objects = _objects(parse_config(_data()))
    router = objects["router-deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]["command"]
    epp_pod = objects["epp-deployment.yaml"]["spec"]["template"]["spec"]
    epp = epp_pod["containers"][0]["command"]
    start = router.index("--discovery")
    shared = router[start : router.index("--request-timeout")]
    assert (
        epp[:2] == ["corral", "epp"]
        and shared == epp[epp.index("--discovery") : epp.index("--shutdown-timeout")]
    )
    pool = objects["inferencepool.yaml"]["spec"]
    assert pool["targetPorts"] == [{"number": int(router[router.index("--engine-port") + 1])}]  # the gates
    assert pool["endpointPickerRef"]["port"]["number"] == int(epp[epp.index("--grpc-port") + 1])
    assert pool["endpointPickerRef"]["failureMode"] == "FailClose"
    container = epp_pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["livenessProbe"]["grpc"]["service"] == "liveness"
    assert container["readinessProbe"]["grpc"]["service"] == "readiness"
    policy = objects["engine-networkpolicy.yaml"]["spec"]["ingress"]
    readers = policy[0]["from"]
    assert {
        "podSelector": {"matchLabels": {"corral.dev/deployment": "qwen-7b", "corral.dev/role": "epp"}}
    } in readers
    assert any(rule["ports"] == [{"port": 8080, "protocol": "TCP"}] for rule in policy[1:])  # the gateway's


def test_no_gateway_section_renders_none_of_it() -> None:
    data = _data()
    del data["gateway"]
    names = set(_objects(parse_config(data)))
    assert not {n for n in names if n.startswith("epp-") or n in ("inferencepool.yaml", "httproute.yaml")}


@pytest.mark.parametrize(
    "gateway",
    [
        {},  # no gateway_name
        {"gateway_name": "gw", "failure_mode": "FailSometimes"},
        {"gateway_name": "gw", "proxy_from": [{}]},
        {"gateway_name": "gw", "grpc_port": 0},
        {"gateway_name": "Not_A_Name"},
        {"gateway_name": "gw", "surprise": 1},
    ],
)
def test_a_bad_gateway_section_is_refused(gateway: dict[str, Any]) -> None:
    data = _data()
    data["gateway"] = gateway
    with pytest.raises(ConfigError, match="gateway"):
        parse_config(data)
