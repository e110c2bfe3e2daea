"""The PrometheusRule of Corral's alerts and the ServiceMonitors for the router, the endpoint picker
(with `gateway:`) and the engine pods.

Each alert's `runbook_url` points at its section of docs/alerts.md. Durations come from the render's own
budgets: an engine is "not READY too long" only past its startup window, a drain only past its drain
timeout, so an alert fires exactly when the deployment has left what its corral.yaml allows."""

from __future__ import annotations

import math

from corral.k8s.render import commands
from corral.k8s.render.budgets import Budgets
from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.monitoring_dashboard import dashboard_config_map
from corral.k8s.render.parts import Obj, engine_name, object_labels, object_meta, router_name

MONITORING_API = "monitoring.coreos.com/v1"


def _labels(config: CorralDeployment) -> dict[str, str]:
    return {**config.monitoring.labels, **object_labels(config, {}, "monitoring")}


def _seconds(value: float) -> str:
    return f"{max(1, math.ceil(value))}s"


def alert_rules(config: CorralDeployment, budgets: Budgets) -> list[Obj]:
    """(alert, expr, for, severity, summary) as PrometheusRule rules."""
    ns = f'namespace="{config.namespace}"'
    eng = f'{ns}, service="{engine_name(config)}"'
    rtr = f'{ns}, service="{router_name(config)}"'
    rules = [
        (
            "CorralEngineNotReady",
            f"corral_supervisor_ready{{{eng}}} == 0",
            _seconds(budgets.startup_window),
            "critical",
            "engine {{ $labels.pod }} not READY for longer than its startup window",
        ),
        (
            "CorralDrainPastDeadline",
            f'corral_supervisor_state{{{eng}, state="DRAINING"}} == 1',
            _seconds(budgets.drain_timeout),
            "warning",
            "engine {{ $labels.pod }} has been DRAINING longer than its drain timeout",
        ),
        (
            "CorralForcedExits",
            "sum by (pod) (increase(corral_supervisor_forced_exit_requests_total"
            f'{{{eng}, tokens_emitted="true"}}[10m])) > 0',
            "0s",
            "warning",
            "engine {{ $labels.pod }} cut requests that had already streamed tokens",
        ),
        (
            "CorralZombieSuspect",
            "sum by (pod) (rate(corral_supervisor_admission_rejected_total"
            f'{{{eng}, reason="not_ready"}}[5m])) > 0',
            "2m",
            "critical",
            "requests still reach {{ $labels.pod }}, which its supervisor says is not READY",
        ),
        (
            "CorralPreloadFallbackToDisk",
            f"sum by (pod) (increase(corral_supervisor_preload_fallbacks_total{{{eng}}}[15m])) > 0",
            "0s",
            "warning",
            "engine {{ $labels.pod }} fell back to loading its weights from disk",
        ),
        (
            "CorralStreamFailures",
            f"sum(rate(corral_router_stream_failures_total{{{rtr}}}[5m])) / "
            f"clamp_min(sum(rate(corral_router_requests_total{{{rtr}}}[5m])), 1e-9) > 0.01",
            "5m",
            "warning",
            "more than 1% of the router's streams end abnormally",
        ),
        (
            "CorralSupervisorFailed",
            f'corral_supervisor_state{{{eng}, state="FAILED"}} == 1',
            "1m",
            "critical",
            "engine {{ $labels.pod }} is FAILED",
        ),
    ]
    base = config.monitoring.runbook_url_base or "docs/alerts.md"
    return [
        {
            "alert": name,
            "expr": expr,
            "for": duration,
            "labels": {"severity": severity},
            "annotations": {"summary": summary, "runbook_url": f"{base}#{name.lower()}"},
        }
        for name, expr, duration, severity, summary in rules
    ]


def prometheus_rule(config: CorralDeployment, budgets: Budgets) -> Obj:
    return {
        "apiVersion": MONITORING_API,
        "kind": "PrometheusRule",
        "metadata": object_meta(config, f"{config.name}-alerts", _labels(config)),
        "spec": {"groups": [{"name": f"corral-{config.name}", "rules": alert_rules(config, budgets)}]},
    }


def engine_service_monitor(config: CorralDeployment) -> Obj:
    """The supervisor's /metrics on its port and vLLM's /metrics through the gate (the only path the gate
    serves besides inference)."""
    interval = config.monitoring.scrape_interval
    return {
        "apiVersion": MONITORING_API,
        "kind": "ServiceMonitor",
        "metadata": object_meta(config, engine_name(config), _labels(config)),
        "spec": {
            "selector": {"matchLabels": commands.engine_selector(config)},
            "namespaceSelector": {"matchNames": [config.namespace]},
            "endpoints": [
                {"port": "supervisor", "path": "/metrics", "interval": interval},
                {"port": "http", "path": "/metrics", "interval": interval},
            ],
        },
    }


def router_service_monitor(config: CorralDeployment) -> Obj:
    """The router's /metrics answers only the admin key: Prometheus sends it from the same Secret."""
    return _admin_service_monitor(config, router_name(config), commands.router_selector(config))


def epp_service_monitor(config: CorralDeployment) -> Obj:
    """The endpoint picker's /metrics (its HTTP port), behind the same admin key as the router's."""
    return _admin_service_monitor(config, f"{config.name}-epp", commands.epp_selector(config))


def _admin_service_monitor(config: CorralDeployment, name: str, selector: dict[str, str]) -> Obj:
    return {
        "apiVersion": MONITORING_API,
        "kind": "ServiceMonitor",
        "metadata": object_meta(config, name, _labels(config)),
        "spec": {
            "selector": {"matchLabels": selector},
            "namespaceSelector": {"matchNames": [config.namespace]},
            "endpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "interval": config.monitoring.scrape_interval,
                    "authorization": {
                        "type": "Bearer",
                        "credentials": {
                            "name": config.router_admin_secret,
                            "key": config.router.admin_key.key,
                        },
                    },
                }
            ],
        },
    }


def monitoring_objects(config: CorralDeployment, budgets: Budgets) -> list[tuple[str, Obj]]:
    """(file name, object) of each monitoring object the config turns on."""
    m = config.monitoring
    objects: list[tuple[str, Obj]] = []
    if m.grafana_dashboard:
        objects.append(("grafana-dashboard-configmap.yaml", dashboard_config_map(config)))
    if m.prometheus_rules:
        objects.append(("prometheusrule.yaml", prometheus_rule(config, budgets)))
    if m.service_monitors:
        objects.append(("engine-servicemonitor.yaml", engine_service_monitor(config)))
        objects.append(("router-servicemonitor.yaml", router_service_monitor(config)))
        if config.gateway is not None:
            objects.append(("epp-servicemonitor.yaml", epp_service_monitor(config)))
    return objects
