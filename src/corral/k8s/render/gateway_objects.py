"""corral.yaml's `gateway:` as objects: the InferencePool (inference.networking.k8s.io/v1) over the engine
pods' admission gates, whose endpointPickerRef names `corral epp`; the picker's ServiceAccount, Role and
RoleBinding, Deployment and Service, hardened as the router's are; an HTTPRoute that sends the named
Gateway's traffic to the pool. The picker follows the same supervisors as the router and acknowledges
their removals, so a drain waits for it too."""

from __future__ import annotations

from corral.k8s.render import commands
from corral.k8s.render.budgets import ROUTER_LEAVE_SECONDS, Budgets
from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.parts import (
    TMP_VOLUME,
    Obj,
    container_resources,
    container_security,
    object_labels,
    object_meta,
)
from corral.k8s.render.router_objects import front_door_deployment, pod_reader_rbac, router_secret_volumes

INFERENCE_API = "inference.networking.k8s.io"
GATEWAY_API = "gateway.networking.k8s.io/v1"


def epp_name(config: CorralDeployment) -> str:
    return f"{config.name}-epp"


def pool_name(config: CorralDeployment) -> str:
    return f"{config.name}-pool"


def _grpc_probe(service: str, port: int, period: int, failure_threshold: int, timeout: int) -> Obj:
    """The kubelet's gRPC health probe of one of the picker's health services."""
    return {
        "grpc": {"port": port, "service": service},
        "periodSeconds": period,
        "failureThreshold": failure_threshold,
        "successThreshold": 1,
        "timeoutSeconds": timeout,
    }


def epp_deployment(config: CorralDeployment, budgets: Budgets) -> Obj:
    gateway = config.gateway
    assert gateway is not None
    selector = commands.epp_selector(config)
    timeout = config.probes.timeout_seconds
    volumes, mounts = router_secret_volumes(config)
    container: Obj = {
        "name": "epp",
        "image": config.router.image or config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": commands.epp_argv(config, budgets),
        "ports": [
            {"name": "grpc", "containerPort": gateway.grpc_port, "protocol": "TCP"},
            {"name": "http", "containerPort": gateway.http_port, "protocol": "TCP"},
        ],
        # liveness: the process answers; readiness: something routable (the gateway's failure mode
        # decides what an unready picker means for its requests)
        "livenessProbe": _grpc_probe("liveness", gateway.grpc_port, 10, 3, timeout),
        "readinessProbe": _grpc_probe("readiness", gateway.grpc_port, 2, 1, timeout),
        # keep answering while the Service endpoint is removed, then SIGTERM lets open exchanges finish
        "lifecycle": {
            "preStop": {
                "exec": {"command": ["python3", "-c", f"import time; time.sleep({ROUTER_LEAVE_SECONDS})"]}
            }
        },
        "securityContext": container_security(config),
        "volumeMounts": [*mounts, {"name": TMP_VOLUME, "mountPath": "/tmp"}],
    }
    resources = container_resources({}, gateway.cpu, gateway.memory)
    if resources:
        container["resources"] = resources
    return front_door_deployment(
        config, epp_name(config), selector, gateway.replicas, container, volumes, budgets
    )


def epp_service(config: CorralDeployment) -> Obj:
    gateway = config.gateway
    assert gateway is not None
    selector = commands.epp_selector(config)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(config, epp_name(config), object_labels(config, selector, "epp")),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [
                {
                    "name": "grpc",
                    "port": gateway.grpc_port,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
                {"name": "http", "port": gateway.http_port, "targetPort": "http", "protocol": "TCP"},
            ],
        },
    }


def inference_pool(config: CorralDeployment) -> Obj:
    """The engine pods by the engines' selector, reached at their admission gate (a request reaches
    only a READY engine even when the gateway fails open), picked by the endpoint picker."""
    gateway = config.gateway
    assert gateway is not None
    selector = commands.engine_selector(config)
    return {
        "apiVersion": f"{INFERENCE_API}/v1",
        "kind": "InferencePool",
        "metadata": object_meta(
            config, pool_name(config), object_labels(config, commands.epp_selector(config), "pool")
        ),
        "spec": {
            "selector": {"matchLabels": selector},
            "targetPorts": [{"number": config.supervisor.gate_port}],
            "appProtocol": "http",
            "endpointPickerRef": {
                "kind": "Service",
                "name": epp_name(config),
                "port": {"number": gateway.grpc_port},
                "failureMode": gateway.failure_mode,
            },
        },
    }


def http_route(config: CorralDeployment) -> Obj:
    """An example route: every path of the named Gateway's listeners to the pool."""
    gateway = config.gateway
    assert gateway is not None
    parent: Obj = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway.gateway_name}
    if gateway.gateway_namespace is not None:
        parent["namespace"] = gateway.gateway_namespace
    return {
        "apiVersion": GATEWAY_API,
        "kind": "HTTPRoute",
        "metadata": object_meta(
            config, pool_name(config), object_labels(config, commands.epp_selector(config), "route")
        ),
        "spec": {
            "parentRefs": [parent],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "backendRefs": [
                        {"group": INFERENCE_API, "kind": "InferencePool", "name": pool_name(config)}
                    ],
                }
            ],
        },
    }


def gateway_objects(config: CorralDeployment, budgets: Budgets) -> list[tuple[str, Obj]]:
    """(file name, object) of each gateway object, in apply order; none without `gateway:`."""
    if config.gateway is None:
        return []
    rbac = pod_reader_rbac(config, epp_name(config), commands.epp_selector(config), "epp")
    return [
        *(
            (f"epp-{kind}.yaml", obj)
            for kind, obj in zip(("serviceaccount", "role", "rolebinding"), rbac, strict=True)
        ),
        ("epp-deployment.yaml", epp_deployment(config, budgets)),
        ("epp-service.yaml", epp_service(config)),
        ("inferencepool.yaml", inference_pool(config)),
        ("httproute.yaml", http_route(config)),
    ]
