"""The Kubernetes objects of one Corral deployment, as plain dicts: the engine Deployment (supervisor as
entrypoint, probes on its /startupz, /readyz, /livez, preStop drain), its headless Service and
PodDisruptionBudget, and the router's ServiceAccount, Role, RoleBinding, Deployment, Service and
PodDisruptionBudget.

Conventions the router relies on: engine pods carry `corral.dev/deployment=NAME` and
`corral.dev/role=engine` (the router's --selector) and serve OpenAI on `engine.port` (its
--engine-port); the annotation `corral.dev/supervisor-port` (read by the router's pod source) says
where the supervisor's state stream answers, and `corral.dev/engine-port` where the engine does. The
router mounts the same token Secret as the supervisors, to subscribe and acknowledge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.k8s_render import commands
from corral.k8s_render.budgets import ROUTER_LEAVE_SECONDS, Budgets
from corral.k8s_render.config import CorralDeployment
from corral.router.k8s.pod_source import SUPERVISOR_PORT_ANNOTATION

Obj = dict[str, Any]

TOKEN_VOLUME = "corral-token"
STATE_VOLUME = "corral-state"
SHM_VOLUME = "dshm"


@dataclass(frozen=True)
class Manifest:
    """One object and the file it is written to."""

    filename: str
    obj: Obj

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])


def _labels(config: CorralDeployment, selector: dict[str, str], component: str) -> dict[str, str]:
    # the config's labels first, so they can never replace the ones selection depends on
    return {
        **config.labels,
        "app.kubernetes.io/name": config.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "corral",
        "app.kubernetes.io/managed-by": "corral-k8s-render",
        **selector,
    }


def _meta(config: CorralDeployment, name: str, labels: dict[str, str]) -> Obj:
    return {"name": name, "namespace": config.namespace, "labels": labels}


def _resources(extended: dict[str, str], cpu: str | None, memory: str | None) -> Obj:
    amounts = dict(extended)
    if cpu is not None:
        amounts["cpu"] = cpu
    if memory is not None:
        amounts["memory"] = memory
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def _http_probe(path: str, port: str, period: int, failure_threshold: int, timeout: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": port, "scheme": "HTTP"},
        "periodSeconds": period,
        "failureThreshold": failure_threshold,
        "successThreshold": 1,
        "timeoutSeconds": timeout,
    }


def engine_name(config: CorralDeployment) -> str:
    return f"{config.name}-engine"


def router_name(config: CorralDeployment) -> str:
    return f"{config.name}-router"


def _engine_env(config: CorralDeployment) -> list[Obj]:
    env: list[Obj] = [{"name": k, "value": v} for k, v in config.engine.env.items()]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": ref.secret_name, "key": ref.key}}}
        for k, ref in config.engine.secret_env.items()
    ]
    return env


def _token_volume(config: CorralDeployment) -> Obj:
    """The management token as a read-only file: supervisors require it, routers present it."""
    return {
        "name": TOKEN_VOLUME,
        "secret": {
            "secretName": config.token_secret,
            "items": [{"key": config.token.key, "path": config.token.key}],
            "defaultMode": 0o400,
        },
    }


_TOKEN_MOUNT: Obj = {"name": TOKEN_VOLUME, "mountPath": commands.TOKEN_DIR, "readOnly": True}


def _engine_volumes(config: CorralDeployment) -> tuple[list[Obj], list[Obj]]:
    volumes: list[Obj] = [_token_volume(config), {"name": STATE_VOLUME, "emptyDir": {}}]
    mounts: list[Obj] = [dict(_TOKEN_MOUNT), {"name": STATE_VOLUME, "mountPath": commands.STATE_DIR}]
    if config.engine.shm_size is not None:
        volumes.append(
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": config.engine.shm_size}}
        )
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    for v in config.engine.volumes:
        volumes.append({"name": v.name, "hostPath": {"path": v.host_path, "type": v.type}})
        mount: Obj = {"name": v.name, "mountPath": v.mount_path}
        if v.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    return volumes, mounts


def engine_deployment(config: CorralDeployment, budgets: Budgets) -> Obj:
    selector = commands.engine_selector(config)
    labels = _labels(config, selector, "engine")
    p = config.probes
    volumes, mounts = _engine_volumes(config)
    container: Obj = {
        "name": "engine",
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": commands.supervisor_argv(config, budgets),
        "ports": [
            {"name": "http", "containerPort": config.engine.port, "protocol": "TCP"},
            {"name": "supervisor", "containerPort": config.supervisor.port, "protocol": "TCP"},
        ],
        "resources": _resources(
            {config.gpu.resource: str(config.engine.gpus)}, config.engine.cpu, config.engine.memory
        ),
        "startupProbe": _http_probe(
            "/startupz",
            "supervisor",
            budgets.startup_period,
            budgets.startup_failure_threshold,
            p.timeout_seconds,
        ),
        "readinessProbe": _http_probe(
            "/readyz",
            "supervisor",
            p.readiness_period_seconds,
            p.readiness_failure_threshold,
            p.timeout_seconds,
        ),
        "livenessProbe": _http_probe(
            "/livez", "supervisor", p.liveness_period_seconds, p.liveness_failure_threshold, p.timeout_seconds
        ),
        "lifecycle": {"preStop": {"exec": {"command": commands.prestop_argv(config, budgets)}}},
        "volumeMounts": mounts,
    }
    env = _engine_env(config)
    if env:
        container["env"] = env
    pod_spec: Obj = {
        "automountServiceAccountToken": False,  # the engine never talks to the API server
        "terminationGracePeriodSeconds": budgets.termination_grace,
        "containers": [container],
        "volumes": volumes,
    }
    if config.engine.node_selector:
        pod_spec["nodeSelector"] = dict(config.engine.node_selector)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(config, engine_name(config), labels),
        "spec": {
            "replicas": config.replicas,
            "selector": {"matchLabels": selector},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {
                    "maxSurge": budgets.rollout.max_surge,
                    "maxUnavailable": budgets.rollout.max_unavailable,
                },
            },
            "progressDeadlineSeconds": budgets.progress_deadline,
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "corral.dev/engine-port": str(config.engine.port),
                        SUPERVISOR_PORT_ANNOTATION: str(config.supervisor.port),
                        "corral.dev/model": config.model.served_name,
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def engine_service(config: CorralDeployment) -> Obj:
    """Headless: the router finds engine pods itself; this gives them DNS names and a scrape target."""
    selector = commands.engine_selector(config)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(config, engine_name(config), _labels(config, selector, "engine")),
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            "ports": [
                {"name": "http", "port": config.engine.port, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "supervisor",
                    "port": config.supervisor.port,
                    "targetPort": "supervisor",
                    "protocol": "TCP",
                },
            ],
        },
    }


def _pdb(config: CorralDeployment, name: str, selector: dict[str, str], component: str, n: int) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(config, name, _labels(config, selector, component)),
        "spec": {"maxUnavailable": n, "selector": {"matchLabels": selector}},
    }


def engine_pdb(config: CorralDeployment, budgets: Budgets) -> Obj:
    return _pdb(
        config, engine_name(config), commands.engine_selector(config), "engine", budgets.pdb_max_unavailable
    )


def router_service_account(config: CorralDeployment) -> Obj:
    selector = commands.router_selector(config)
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(config, router_name(config), _labels(config, selector, "router")),
    }


def router_role(config: CorralDeployment) -> Obj:
    """The router lists and watches pods in its namespace, nothing more."""
    selector = commands.router_selector(config)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(config, f"{router_name(config)}-pods", _labels(config, selector, "router")),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }


def router_role_binding(config: CorralDeployment) -> Obj:
    selector = commands.router_selector(config)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(config, f"{router_name(config)}-pods", _labels(config, selector, "router")),
        "subjects": [{"kind": "ServiceAccount", "name": router_name(config), "namespace": config.namespace}],
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": f"{router_name(config)}-pods",
        },
    }


def router_deployment(config: CorralDeployment, budgets: Budgets) -> Obj:
    selector = commands.router_selector(config)
    labels = _labels(config, selector, "router")
    r = config.router
    # /metrics answers whenever the router's event loop does; /health would follow the engines, and a
    # router taken out of its Service (or restarted) because the engines are down helps no one.
    alive = _http_probe("/metrics", "http", 10, 3, config.probes.timeout_seconds)
    container: Obj = {
        "name": "router",
        "image": r.image or config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": commands.router_argv(config, budgets),
        "ports": [{"name": "http", "containerPort": r.port, "protocol": "TCP"}],
        "readinessProbe": _http_probe("/metrics", "http", 2, 1, config.probes.timeout_seconds),
        "livenessProbe": alive,
        # keep serving while the Service endpoint is being removed, then SIGTERM lets open streams finish
        "lifecycle": {
            "preStop": {
                "exec": {"command": ["python3", "-c", f"import time; time.sleep({ROUTER_LEAVE_SECONDS})"]}
            }
        },
        "volumeMounts": [dict(_TOKEN_MOUNT)],
    }
    resources = _resources({}, r.cpu, r.memory)
    if resources:
        container["resources"] = resources
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(config, router_name(config), labels),
        "spec": {
            "replicas": r.replicas,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": router_name(config),
                    "terminationGracePeriodSeconds": budgets.router_grace,
                    "containers": [container],
                    "volumes": [_token_volume(config)],
                },
            },
        },
    }


def router_service(config: CorralDeployment) -> Obj:
    selector = commands.router_selector(config)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(config, router_name(config), _labels(config, selector, "router")),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": config.router.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def render(config: CorralDeployment, budgets: Budgets) -> list[Manifest]:
    """Every object, in apply order (RBAC before the pods that use it)."""
    manifests = [
        Manifest("engine-deployment.yaml", engine_deployment(config, budgets)),
        Manifest("engine-service.yaml", engine_service(config)),
        Manifest("engine-pdb.yaml", engine_pdb(config, budgets)),
        Manifest("router-serviceaccount.yaml", router_service_account(config)),
        Manifest("router-role.yaml", router_role(config)),
        Manifest("router-rolebinding.yaml", router_role_binding(config)),
        Manifest("router-deployment.yaml", router_deployment(config, budgets)),
        Manifest("router-service.yaml", router_service(config)),
    ]
    if config.router.replicas > 1:
        manifests.append(
            Manifest(
                "router-pdb.yaml",
                _pdb(config, router_name(config), commands.router_selector(config), "router", 1),
            )
        )
    return manifests
