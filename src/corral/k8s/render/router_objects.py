"""The router's objects: its ServiceAccount, Role and RoleBinding (list and watch pods), its
Deployment with the fleet key, admin key and tenants' API keys file mounted from Secrets, and its
Service.
"""

from __future__ import annotations

from corral.k8s.render import commands
from corral.k8s.render.budgets import ROUTER_LEAVE_SECONDS, Budgets
from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.kv_events_plan import SIM_TOKENIZER
from corral.k8s.render.parts import (
    ADMIN_KEY_VOLUME,
    ENGINE_API_KEY_VOLUME,
    KEY_MOUNT,
    TENANT_KEYS_VOLUME,
    TMP_VOLUME,
    Obj,
    container_resources,
    container_security,
    http_probe,
    key_volume,
    object_labels,
    object_meta,
    pod_security,
    router_name,
    secret_file_volume,
)
from corral.pod_labels import ROLE_LABEL

ROUTER_HF_HOME = "/tmp/huggingface"  # in the router's /tmp emptyDir


def router_secret_volumes(config: CorralDeployment) -> tuple[list[Obj], list[Obj]]:
    """The router's keys (and the endpoint picker's): the fleet key, the admin key, the tenants' API keys
    file (router.tenant_keys), and the engines' API key when they enforce one (the same Secret key the
    engine container reads as VLLM_API_KEY)."""
    volumes = [
        key_volume(config),
        secret_file_volume(ADMIN_KEY_VOLUME, config.router_admin_secret, config.router.admin_key.key),
    ]
    mounts = [
        dict(KEY_MOUNT),
        {"name": ADMIN_KEY_VOLUME, "mountPath": commands.ADMIN_KEY_DIR, "readOnly": True},
    ]
    tenants = config.router.tenant_keys
    if tenants is not None:
        volumes.append(secret_file_volume(TENANT_KEYS_VOLUME, tenants.secret_name, tenants.key))
        mounts.append({"name": TENANT_KEYS_VOLUME, "mountPath": commands.TENANT_KEYS_DIR, "readOnly": True})
    engine_key = config.engine_api_key
    if engine_key is not None:
        volumes.append(secret_file_volume(ENGINE_API_KEY_VOLUME, engine_key.secret_name, engine_key.key))
        mounts.append(
            {"name": ENGINE_API_KEY_VOLUME, "mountPath": commands.ENGINE_API_KEY_DIR, "readOnly": True}
        )
    return volumes, mounts


def pod_reader_rbac(
    config: CorralDeployment, name: str, selector: dict[str, str], component: str
) -> list[Obj]:
    """A ServiceAccount `name` that lists and watches pods in its namespace, nothing more: its Role and
    RoleBinding (the router's, and the endpoint picker's)."""
    labels = object_labels(config, selector, component)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": object_meta(config, name, labels)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": object_meta(config, f"{name}-pods", labels),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": object_meta(config, f"{name}-pods", labels),
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": config.namespace}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{name}-pods"},
        },
    ]


def router_rbac(config: CorralDeployment) -> list[Obj]:
    """The router's ServiceAccount, Role and RoleBinding."""
    return pod_reader_rbac(config, router_name(config), commands.router_selector(config), "router")


def router_deployment(config: CorralDeployment, budgets: Budgets) -> Obj:
    selector = commands.router_selector(config)
    r = config.router
    # /livez answers whenever the router's event loop does, to anyone (/metrics wants the admin key on
    # the pod network); /health would follow the engines, and a router taken out of its Service (or
    # restarted) because the engines are down helps no one.
    alive = http_probe("/livez", "http", 10, 3, config.probes.timeout_seconds)
    secret_volumes, secret_mounts = router_secret_volumes(config)
    container: Obj = {
        "name": "router",
        "image": r.image or config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": commands.router_argv(config, budgets),
        "ports": [{"name": "http", "containerPort": r.port, "protocol": "TCP"}],
        "readinessProbe": http_probe("/livez", "http", 2, 1, config.probes.timeout_seconds),
        "livenessProbe": alive,
        # keep serving while the Service endpoint is being removed, then SIGTERM lets open streams finish
        "lifecycle": {
            "preStop": {
                "exec": {"command": ["python3", "-c", f"import time; time.sleep({ROUTER_LEAVE_SECONDS})"]}
            }
        },
        "securityContext": container_security(config),
        "volumeMounts": [*secret_mounts, {"name": TMP_VOLUME, "mountPath": "/tmp"}],
    }
    tokenizer = commands.router_tokenizer(config)
    if tokenizer is not None and tokenizer != SIM_TOKENIZER:
        # a hub id is downloaded on start; the root filesystem (and HOME in it) may be read-only
        container["env"] = [{"name": "HF_HOME", "value": ROUTER_HF_HOME}]
    resources = container_resources({}, r.cpu, r.memory)
    if resources:
        container["resources"] = resources
    return front_door_deployment(
        config, router_name(config), selector, r.replicas, container, secret_volumes, budgets
    )


def front_door_deployment(
    config: CorralDeployment,
    name: str,
    selector: dict[str, str],
    replicas: int,
    container: Obj,
    volumes: list[Obj],
    budgets: Budgets,
) -> Obj:
    """A router's or an endpoint picker's Deployment: one container, its ServiceAccount `name`, a /tmp
    emptyDir, the pod hardened, replaced one pod at a time and never fewer than `replicas` ready."""
    labels = object_labels(config, selector, selector[ROLE_LABEL])  # the component is the role
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(config, name, labels),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": name,
                    "terminationGracePeriodSeconds": budgets.router_grace,
                    "securityContext": pod_security(config),
                    "containers": [container],
                    "volumes": [*volumes, {"name": TMP_VOLUME, "emptyDir": {}}],
                },
            },
        },
    }


def router_service(config: CorralDeployment) -> Obj:
    selector = commands.router_selector(config)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(config, router_name(config), object_labels(config, selector, "router")),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": config.router.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
