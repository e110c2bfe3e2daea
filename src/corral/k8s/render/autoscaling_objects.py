"""The engine Deployment's autoscaler: a HorizontalPodAutoscaler (autoscaling/v2) on the External
metric `corral_router_model_desired_replicas` (a Prometheus adapter serves it, the router's
ServiceMonitor scrapes it), or a KEDA ScaledObject whose Prometheus trigger asks the same series.

The router's series is already a replica count (the rule in docs/scaling.md), so the target is an
average value of 1 per engine: the autoscaler's count is the router's. Scale-down removes at most one
engine per termination grace period: the pod the ReplicaSet picks runs its preStop (`corral supervise
prestop`: the drain) within that grace, so engines leave one drain at a time, never cut."""

from __future__ import annotations

from corral.k8s.render.budgets import Budgets
from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.parts import Obj, engine_name, object_labels, object_meta, router_name

METRIC = "corral_router_model_desired_replicas"
HPA_POLICY_PERIOD_MAX = 1800  # the API's bound on a scaling policy's periodSeconds


def desired_query(config: CorralDeployment) -> str:
    """The PromQL for the fleet's desired engines: the highest any router says (each router reads the
    same engines; their counts are not added)."""
    return f'max({METRIC}{{namespace="{config.namespace}", service="{router_name(config)}"}})'


def _behavior(config: CorralDeployment, budgets: Budgets) -> Obj:
    period = min(HPA_POLICY_PERIOD_MAX, max(15, budgets.termination_grace))
    return {
        "scaleDown": {
            "stabilizationWindowSeconds": config.autoscaling.scale_down_stabilization_seconds,
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": period}],
        },
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}],
        },
    }


def _target(config: CorralDeployment) -> Obj:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": engine_name(config)}


def horizontal_pod_autoscaler(config: CorralDeployment, budgets: Budgets) -> Obj:
    a = config.autoscaling
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": object_meta(config, engine_name(config), object_labels(config, {}, "autoscaling")),
        "spec": {
            "scaleTargetRef": _target(config),
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {
                            "name": METRIC,
                            "selector": {"matchLabels": {"service": router_name(config)}},
                        },
                        "target": {"type": "AverageValue", "averageValue": "1"},
                    },
                }
            ],
            "behavior": _behavior(config, budgets),
        },
    }


def scaled_object(config: CorralDeployment, budgets: Budgets) -> Obj:
    a = config.autoscaling
    assert a.prometheus_address is not None  # the config's validation
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": object_meta(config, engine_name(config), object_labels(config, {}, "autoscaling")),
        "spec": {
            "scaleTargetRef": _target(config),
            "pollingInterval": a.polling_interval_seconds,
            "cooldownPeriod": a.scale_down_stabilization_seconds,
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": a.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(config, budgets)}},
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": a.prometheus_address,
                        "query": desired_query(config),
                        "threshold": "1",
                    },
                }
            ],
        },
    }


def autoscaling_objects(config: CorralDeployment, budgets: Budgets) -> list[tuple[str, Obj]]:
    a = config.autoscaling
    if not a.enabled:
        return []
    if a.scaler == "keda":
        return [("engine-scaledobject.yaml", scaled_object(config, budgets))]
    return [("engine-hpa.yaml", horizontal_pod_autoscaler(config, budgets))]
