"""The autoscaler `corral k8s render` adds (`autoscaling` in corral.yaml): the HPA validates against
Kubernetes' own schema, the KEDA ScaledObject against a subset of KEDA's CRD kept in tests/data (its
`$comment` names the source); both read the router's desired replica count with PromQL that parses
and names a series the router exports; scale-down goes one engine per termination grace, and the
target Deployment drains each engine it loses in its preStop; bad combinations are refused; the
committed example is current."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from corral.k8s.render.budgets import derive
from corral.k8s.render.config_reading import ConfigError, parse_config
from corral.k8s.render.manifests import render
from corral.k8s.render.output import document
from corral.router.routing.load_board import LoadBoard
from corral.router.telemetry.scaling import ScalingCollector, ScalingTargets

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "autoscaling"
KEDA = json.loads(
    (ROOT / "tests" / "data" / "keda_scaledobject_subset.schema.json").read_text(encoding="utf-8")
)
KUBERNETES = "1.30.0"
REGENERATE = (
    "corral k8s render --config deploy/examples/autoscaling/corral.yaml"
    " --out deploy/examples/autoscaling/rendered"
)
KEDA_ON = {
    "enabled": True,
    "scaler": "keda",
    "prometheus_address": "http://prometheus-operated.monitoring:9090",
}


def example(**autoscaling: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLE / "corral.yaml").read_text(encoding="utf-8"))
    data["autoscaling"] = {**data["autoscaling"], **autoscaling}
    return data


def objects(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    config = parse_config(data)
    return {m.filename: yaml.safe_load(yaml.safe_dump(m.obj)) for m in render(config, derive(config))}


def test_the_hpa_and_the_deployment_it_scales_validate() -> None:
    objs = objects(example())
    for obj in objs.values():
        if obj["apiVersion"] != "monitoring.coreos.com/v1":  # a CRD: test_k8s_render_monitoring has it
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    hpa = objs["engine-hpa.yaml"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == objs["engine-deployment.yaml"]["metadata"]["name"]
    assert "replicas" not in objs["engine-deployment.yaml"]["spec"]  # the autoscaler owns the count
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == "corral_router_model_desired_replicas"
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}


def test_the_scaled_object_validates_and_a_typo_does_not() -> None:
    objs = objects(example(**KEDA_ON))
    assert "engine-hpa.yaml" not in objs
    scaled = objs["engine-scaledobject.yaml"]
    jsonschema.validate(scaled, KEDA["ScaledObject"])
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "1"
    broken = copy.deepcopy(scaled)
    broken["spec"]["minReplicas"] = 1  # the HPA's word, not KEDA's
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, KEDA["ScaledObject"])
    no_query = copy.deepcopy(scaled)
    del no_query["spec"]["triggers"][0]["metadata"]["query"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(no_query, KEDA["ScaledObject"])


def test_the_query_parses_and_names_a_series_the_router_exports() -> None:
    query = objects(example(**KEDA_ON))["engine-scaledobject.yaml"]["spec"]["triggers"][0]["metadata"][
        "query"
    ]
    promql_parser.parse(query)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScalingCollector(list, lambda m: 0, LoadBoard(), dict, dict, ScalingTargets()))
    assert "# TYPE corral_router_model_desired_replicas gauge" in generate_latest(registry).decode()
    assert query.startswith("max(corral_router_model_desired_replicas{")


@pytest.mark.parametrize("autoscaling", [{}, KEDA_ON])
def test_scale_down_drains_one_engine_per_termination_grace(autoscaling: dict[str, Any]) -> None:
    data = example(**autoscaling)
    config = parse_config(data)
    budgets = derive(config)
    objs = objects(data)
    scaler = objs.get("engine-hpa.yaml") or objs["engine-scaledobject.yaml"]
    spec = scaler["spec"]
    behavior = (
        spec["behavior"]
        if "behavior" in spec
        else spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    )
    (policy,) = behavior["scaleDown"]["policies"]
    assert policy == {"type": "Pods", "value": 1, "periodSeconds": budgets.termination_grace}
    pod = objs["engine-deployment.yaml"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == budgets.termination_grace
    pre_stop = " ".join(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"])
    assert "prestop" in pre_stop


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"autoscaling": {"enabled": True, "min_replicas": 3, "max_replicas": 2}}, "below min_replicas"),
        ({"autoscaling": {"enabled": True, "scaler": "keda"}}, "needs prometheus_address"),
        ({"autoscaling": {"enabled": True, "min_replicas": 0}}, "min_replicas"),
        ({"autoscaling": {"enabled": True, "max_replicas": 10**9}}, "max_replicas"),
        (
            {"autoscaling": {"enabled": True, "scaler": "keda", "prometheus_address": "ftp://x"}},
            "prometheus_address",
        ),
        ({"autoscaling": {"enabled": True, "surprise": 1}}, "surprise"),
        ({"monitoring": {}}, "service_monitors"),
    ],
)
def test_bad_autoscaling_is_refused_with_the_reason(change: dict[str, Any], complaint: str) -> None:
    data = example()
    data.update(change)
    with pytest.raises(ConfigError, match=complaint):
        parse_config(data)


def test_committed_example_rendering_is_current() -> None:
    config = parse_config(example())
    manifests = render(config, derive(config))
    committed = {p.name: p.read_text(encoding="utf-8") for p in sorted((EXAMPLE / "rendered").glob("*.yaml"))}
    assert sorted(committed) == sorted(m.filename for m in manifests), f"stale: run `{REGENERATE}`"
    for m in manifests:
        assert committed[m.filename] == document(config, m), f"{m.filename} is stale: run `{REGENERATE}`"
