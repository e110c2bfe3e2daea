"""The `monitoring` section of corral.yaml: which monitoring objects `corral k8s render` adds (a Grafana
dashboard ConfigMap, a PrometheusRule of alerts, ServiceMonitors for the router and the engine pods). All
off by default: they need the prometheus-operator CRDs and a Grafana dashboard sidecar in the cluster."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class MonitoringSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grafana_dashboard: bool = Field(
        default=False,
        description="render a ConfigMap holding the Corral Grafana dashboard, labelled grafana_dashboard=1 "
        "for the Grafana dashboard sidecar",
    )
    prometheus_rules: bool = Field(
        default=False, description="render a PrometheusRule (monitoring.coreos.com/v1) with Corral's alerts"
    )
    service_monitors: bool = Field(
        default=False,
        description="render ServiceMonitors for the router (/metrics with the admin key as bearer token) "
        "and the engine pods (the supervisor's /metrics and vLLM's /metrics through the gate); with the "
        "NetworkPolicy on, network_policy.supervisor_from must name the Prometheus pods",
    )
    runbook_url_base: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="where you publish Corral's docs/alerts.md (an http(s) URL); each alert's runbook_url "
        "is this plus #the-alert; null: the path docs/alerts.md#the-alert in Corral's source",
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="extra labels on the monitoring objects, e.g. release: prometheus for the "
        "Prometheus Operator's ruleSelector / serviceMonitorSelector",
    )
    scrape_interval: str = Field(
        default="30s", pattern=r"^[0-9]+(ms|s|m)$", description="ServiceMonitor endpoints' interval"
    )
