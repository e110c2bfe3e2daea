"""The Kubernetes objects of one Corral deployment, as plain dicts: the engine Deployment (supervisor as
entrypoint, probes on its /startupz, /readyz, /livez, preStop drain), its headless Service,
PodDisruptionBudget and NetworkPolicy, and the router's ServiceAccount, Role, RoleBinding, Deployment,
Service and PodDisruptionBudget (a P/D fleet: a Deployment and PDB per role, `pd_objects.py`); with
`supervisor.rollback_bundle`, a ConfigMap holding that bundle's
file, which every engine pod declares (`--bundle`).

Conventions the router relies on: engine pods carry `corral.dev/deployment=NAME` and
`corral.dev/role=engine` (the router's --selector) and serve OpenAI on the supervisor's admission gate
(`supervisor.gate_port`, the router's --engine-port; the engine itself listens on loopback); the
annotation `corral.dev/supervisor-port` (read by the router's pod source) says where the supervisor's
state stream answers, and `corral.dev/engine-port` where the data path does.

Hardening: every pod and container runs with a restricted securityContext (non-root by default, no
privilege escalation, no capabilities, RuntimeDefault seccomp, read-only root filesystem with the
paths that are written as emptyDir volumes); hostPath volumes are read-only unless the config says
otherwise; the NetworkPolicy admits only the routers to the gate and the supervisor. Each supervisor's
token is its own: an init container derives it from the fleet key Secret and the pod's name into a
memory-backed emptyDir; the key is mounted only there and in the routers, which derive the same
token from the pod they discovered. The engine container gets neither the key nor a token in its env.
The router listens on the pod network, so its probes ask the open /livez and its admin routes
(/metrics, /v1/fleet) answer only the admin key, from a Secret mounted in the router pods alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.k8s.render import commands
from corral.k8s.render.autoscaling_objects import autoscaling_objects
from corral.k8s.render.budgets import Budgets
from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.engine_objects import (
    engine_bundles_config_map,
    engine_deployment,
    engine_network_policy,
    engine_pdb,
    engine_service,
)
from corral.k8s.render.gateway_objects import gateway_objects
from corral.k8s.render.kv_events_plan import AGGREGATED, decide
from corral.k8s.render.monitoring_objects import monitoring_objects
from corral.k8s.render.parts import Obj, disruption_budget, router_name
from corral.k8s.render.pd_objects import pd_engine_objects, pd_network_policy
from corral.k8s.render.router_objects import (
    router_deployment,
    router_rbac,
    router_service,
)


@dataclass(frozen=True)
class Manifest:
    """One object and the file it is written to."""

    filename: str
    obj: Obj

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])


def _engines(config: CorralDeployment, budgets: Budgets) -> list[Manifest]:
    """The engine Deployment and its PDB, or in a P/D fleet one of each per role."""
    if config.pd is not None:
        return [Manifest(name, obj) for name, obj in pd_engine_objects(config)]
    deployment = engine_deployment(config, budgets, kv_events=decide(config, AGGREGATED))
    if config.autoscaling.enabled:  # the autoscaler owns the count; an apply must not reset it
        del deployment["spec"]["replicas"]
    return [
        Manifest("engine-deployment.yaml", deployment),
        Manifest("engine-pdb.yaml", engine_pdb(config, budgets)),
    ]


def _network_policy(config: CorralDeployment) -> Obj:
    return engine_network_policy(config) if config.pd is None else pd_network_policy(config)


def render(config: CorralDeployment, budgets: Budgets) -> list[Manifest]:
    """Every object, in apply order (RBAC before the pods that use it)."""
    manifests = [
        *(
            [Manifest("engine-bundles-configmap.yaml", engine_bundles_config_map(config))]
            if config.supervisor.rollback_bundle is not None
            else []
        ),
        *_engines(config, budgets),
        Manifest("engine-service.yaml", engine_service(config)),
        *(
            [Manifest("engine-networkpolicy.yaml", _network_policy(config))]
            if config.network_policy.enabled
            else []
        ),
        *(
            Manifest(f"router-{kind}.yaml", obj)
            for kind, obj in zip(("serviceaccount", "role", "rolebinding"), router_rbac(config), strict=True)
        ),
        Manifest("router-deployment.yaml", router_deployment(config, budgets)),
        Manifest("router-service.yaml", router_service(config)),
    ]
    if config.router.replicas > 1:
        manifests.append(
            Manifest(
                "router-pdb.yaml",
                disruption_budget(config, router_name(config), commands.router_selector(config), "router", 1),
            )
        )
    manifests.extend(Manifest(name, obj) for name, obj in gateway_objects(config, budgets))
    manifests.extend(Manifest(name, obj) for name, obj in monitoring_objects(config, budgets))
    manifests.extend(Manifest(name, obj) for name, obj in autoscaling_objects(config, budgets))
    return manifests
