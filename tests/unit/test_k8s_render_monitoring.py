"""The monitoring objects of `corral k8s render`: every PromQL expression (dashboard targets and alert
rules) parses with a real PromQL parser and names only metrics our code registers or vLLM exports; the
PrometheusRule and ServiceMonitors validate against a schema derived from the prometheus-operator CRDs
(tests/data/prometheus_operator_subset.schema.json says what it covers); the dashboard is what
grafana-foundation-sdk encodes and decodes; alert durations follow the render's budgets; the committed
example is current."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel

from corral.k8s.render.budgets import derive
from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.config_reading import parse_config
from corral.k8s.render.manifests import Manifest, render
from corral.k8s.render.output import document

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "monitoring"
DATA = ROOT / "tests" / "data"
SCHEMAS = json.loads((DATA / "prometheus_operator_subset.schema.json").read_text(encoding="utf-8"))
VLLM_METRICS_PAGE = DATA / "vllm-samples" / "metrics.body"  # vLLM's /metrics, captured from a real engine
REGENERATE = (
    "corral k8s render --config deploy/examples/monitoring/corral.yaml"
    " --out deploy/examples/monitoring/rendered"
)
KUBERNETES = "1.30.0"
MONITORING_KINDS = {"PrometheusRule", "ServiceMonitor"}
# a family's samples: counters end in _total, histograms in _bucket/_sum/_count
SUFFIXES = ("_total", "_bucket", "_sum", "_count")
# Grafana replaces its interval macro before Prometheus sees the query
GRAFANA_MACROS = {"$__rate_interval": "5m", "$__interval": "1m"}


def example() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLE / "corral.yaml").read_text(encoding="utf-8"))
    return data


def build(data: dict[str, Any]) -> tuple[CorralDeployment, list[Manifest]]:
    config = parse_config(data)
    return config, render(config, derive(config))


def objects(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m.filename: m.obj for m in build(data)[1]}


def dashboard_json(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    data = objs["grafana-dashboard-configmap.yaml"]["data"]
    (text,) = data.values()
    board: dict[str, Any] = json.loads(text)
    return board


def all_expressions(objs: dict[str, dict[str, Any]]) -> list[str]:
    board = dashboard_json(objs)
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [r["expr"] for g in objs["prometheusrule.yaml"]["spec"]["groups"] for r in g["rules"]]
    return exprs


def parse(expr: str) -> promql_parser.Expr:
    for macro, value in GRAFANA_MACROS.items():
        expr = expr.replace(macro, value)
    return promql_parser.parse(expr)


def metric_names(expr: str) -> set[str]:
    names: set[str] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(parse(expr), visit)
    return names


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def corral_families() -> set[str]:
    """Every metric family name our source registers (string literals corral_router_/supervisor_...)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "src" / "corral").rglob("*.py"))
    return set(re.findall(r"\"(corral_(?:router|supervisor)_[a-z_]+)\"", text))


def vllm_samples() -> set[str]:
    """Every sample name on vLLM's /metrics page (vllm:..._total, ..._bucket as Prometheus stores them)."""
    page = VLLM_METRICS_PAGE.read_text(encoding="utf-8")
    return set(re.findall(r"^(vllm:[a-z0-9_:]+)[{ ]", page, flags=re.M))


def exported(name: str) -> bool:
    return name in vllm_samples() if name.startswith("vllm:") else family(name) in corral_families()


def test_monitoring_is_off_by_default() -> None:
    data = example()
    del data["monitoring"]
    kinds = {m.kind for m in build(data)[1]}
    assert not kinds & MONITORING_KINDS
    assert "grafana-dashboard-configmap.yaml" not in objects(data)


def test_every_expression_parses_with_a_promql_parser() -> None:
    exprs = all_expressions(objects(example()))
    assert len(exprs) >= 20
    for expr in exprs:
        parse(expr)


@pytest.mark.parametrize(
    "broken",
    ["sum(rate(corral_router_requests_total[5m])", "rate(corral_router_requests_total[5x])", "a >> b"],
)
def test_a_broken_expression_fails_to_parse(broken: str) -> None:
    with pytest.raises(ValueError):
        parse(broken)


def test_every_metric_in_every_query_is_one_we_or_vllm_export() -> None:
    assert exported("corral_supervisor_ready") and exported("vllm:kv_cache_usage_perc")
    used = {name for expr in all_expressions(objects(example())) for name in metric_names(expr)}
    assert used, "no metric found in the queries"
    unknown = sorted(name for name in used if not exported(name))
    assert not unknown, f"queries name metrics nobody exports: {unknown}"


def test_the_name_check_catches_a_misspelt_metric() -> None:
    assert not exported("corral_router_request_total")
    assert not exported("vllm:prefix_cache_hits")  # the counter is stored as ..._total
    assert metric_names("sum(rate(vllm:num_requests_runing[5m]))") == {"vllm:num_requests_runing"}


def test_monitoring_objects_validate_and_core_objects_still_do() -> None:
    for m in build(example())[1]:
        obj = yaml.safe_load(yaml.safe_dump(m.obj))
        if m.kind in MONITORING_KINDS:
            jsonschema.validate(obj, SCHEMAS[m.kind])
        else:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def test_the_crd_schema_rejects_a_misspelt_field_and_a_bad_duration() -> None:
    objs = objects(example())
    rule = copy.deepcopy(objs["prometheusrule.yaml"])
    rule["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rule, SCHEMAS["PrometheusRule"])
    monitor = copy.deepcopy(objs["router-servicemonitor.yaml"])
    monitor["spec"]["endpoints"][0]["bearerTokenFile"] = monitor["spec"]["endpoints"][0].pop("path")
    monitor["spec"]["endpoint"] = monitor["spec"].pop("endpoints")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, SCHEMAS["ServiceMonitor"])


def test_the_dashboard_round_trips_through_the_sdk_model() -> None:
    objs = objects(example())
    cm = objs["grafana-dashboard-configmap.yaml"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = dashboard_json(objs)
    model = DashboardModel.from_json(board)
    assert model.title == "Corral: llama-3-8b"
    assert json.loads(json.dumps(model, cls=JSONEncoder)) == board
    for panel in board["panels"]:
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(set(refs)) == len(refs) and "" not in refs, panel["title"]
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Router", "Supervisors", "Engines (vLLM)"]


def test_alert_durations_follow_the_budgets() -> None:
    data = example()
    config, _ = build(data)
    budgets = derive(config)
    rules = {r["alert"]: r for r in objects(data)["prometheusrule.yaml"]["spec"]["groups"][0]["rules"]}
    assert rules["CorralEngineNotReady"]["for"] == f"{int(-(-budgets.startup_window // 1))}s"
    slower = copy.deepcopy(data)
    slower["startup"]["read_gbps"] = 0.1
    slow_rules = objects(slower)["prometheusrule.yaml"]["spec"]["groups"][0]["rules"]
    assert int(slow_rules[0]["for"][:-1]) > int(rules["CorralEngineNotReady"]["for"][:-1])


def test_every_alert_links_a_section_of_docs_alerts() -> None:
    doc = (ROOT / "docs" / "alerts.md").read_text(encoding="utf-8")
    anchors = {h.strip().lower() for h in re.findall(r"^## (\S+)$", doc, flags=re.M)}
    data = example()
    data["monitoring"]["runbook_url_base"] = "https://docs.example.com/corral/alerts"
    rules = objects(data)["prometheusrule.yaml"]["spec"]["groups"][0]["rules"]
    assert len(rules) == 7
    for rule in rules:
        base, anchor = rule["annotations"]["runbook_url"].split("#")
        assert base == "https://docs.example.com/corral/alerts"
        assert anchor in anchors, f"docs/alerts.md has no section for {rule['alert']}"


def test_router_monitor_sends_the_admin_key_and_the_policy_admits_the_scrapers() -> None:
    config, manifests = build(example())
    objs = {m.filename: m.obj for m in manifests}
    (endpoint,) = objs["router-servicemonitor.yaml"]["spec"]["endpoints"]
    assert endpoint["authorization"]["credentials"] == {
        "name": config.router_admin_secret,
        "key": config.router.admin_key.key,
    }
    service_ports = {p["name"]: p["port"] for p in objs["engine-service.yaml"]["spec"]["ports"]}
    scraped = {service_ports[e["port"]] for e in objs["engine-servicemonitor.yaml"]["spec"]["endpoints"]}
    scrapers = objs["engine-networkpolicy.yaml"]["spec"]["ingress"][1]
    assert scrapers["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
    }
    assert scraped == {p["port"] for p in scrapers["ports"]}


def test_without_monitors_the_scrapers_reach_the_supervisor_port_only() -> None:
    data = example()
    data["monitoring"]["service_monitors"] = False
    config, manifests = build(data)
    policy = {m.filename: m.obj for m in manifests}["engine-networkpolicy.yaml"]
    assert [p["port"] for p in policy["spec"]["ingress"][1]["ports"]] == [config.supervisor.port]


def test_committed_monitoring_example_is_current() -> None:
    config, manifests = build(example())
    committed = {p.name: p.read_text(encoding="utf-8") for p in sorted((EXAMPLE / "rendered").glob("*.yaml"))}
    assert sorted(committed) == sorted(m.filename for m in manifests), f"stale: run `{REGENERATE}`"
    for m in manifests:
        assert committed[m.filename] == document(config, m), f"{m.filename} is stale: run `{REGENERATE}`"
