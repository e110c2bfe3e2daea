"""The Kubernetes objects of one Corral deployment, as plain dicts: the engine Deployment (supervisor as
entrypoint, probes on its /startupz, /readyz, /livez, preStop drain), its headless Service,
PodDisruptionBudget and NetworkPolicy, and the router's ServiceAccount, Role, RoleBinding, Deployment,
Service and PodDisruptionBudget.

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
from typing import Any

from corral.k8s.render import commands
from corral.k8s.render.budgets import ROUTER_LEAVE_SECONDS, Budgets
from corral.k8s.render.config import CorralDeployment, PeerSpec
from corral.router.discovery.k8s_pods import SUPERVISOR_PORT_ANNOTATION

Obj = dict[str, Any]

KEY_VOLUME = "corral-fleet-key"
ADMIN_KEY_VOLUME = "corral-router-admin"
ENGINE_API_KEY_VOLUME = "engine-api-key"
TOKEN_VOLUME = "corral-token"
STATE_VOLUME = "corral-state"
TMP_VOLUME = "tmp"
HOME_VOLUME = "home"
SHM_VOLUME = "dshm"
HOME = "/home/corral"
# Where the engine's libraries write when HOME is not theirs to choose; each under the HOME emptyDir.
ENGINE_HOME_ENV = {
    "HOME": HOME,
    "XDG_CACHE_HOME": f"{HOME}/.cache",
    "HF_HOME": f"{HOME}/.cache/huggingface",
}


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
    if config.security.read_only_root_filesystem:
        # the image's HOME (/root in vLLM's) is read-only: caches go to the HOME emptyDir, unless set
        taken = {*config.engine.env, *config.engine.secret_env}
        env += [{"name": k, "value": v} for k, v in ENGINE_HOME_ENV.items() if k not in taken]
    return env


def _pod_security(config: CorralDeployment) -> Obj:
    sec = config.security
    context: Obj = {"runAsNonRoot": sec.run_as_non_root}
    if sec.run_as_non_root:
        # fsGroup: the fleet key (mode 0440) is readable by the group, never by the world
        context |= {"runAsUser": sec.run_as_user, "runAsGroup": sec.run_as_group, "fsGroup": sec.run_as_group}
    context["seccompProfile"] = {"type": "RuntimeDefault"}
    return context


def _container_security(config: CorralDeployment) -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": config.security.read_only_root_filesystem,
        "runAsNonRoot": config.security.run_as_non_root,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _secret_file_volume(name: str, secret_name: str, key: str) -> Obj:
    """One key of a Secret as a file named after the key, readable by the pod's group only."""
    return {
        "name": name,
        "secret": {"secretName": secret_name, "items": [{"key": key, "path": key}], "defaultMode": 0o440},
    }


def _key_volume(config: CorralDeployment) -> Obj:
    """The fleet key as a read-only file, for the init container that derives the pod's token and for
    the routers that derive every pod's; never for the engine container."""
    return _secret_file_volume(KEY_VOLUME, config.token_secret, config.token.key)


def _router_secret_volumes(config: CorralDeployment) -> tuple[list[Obj], list[Obj]]:
    """The router's keys: the fleet key, its admin key, and the engines' API key when they enforce one
    (the same Secret key the engine container reads as VLLM_API_KEY)."""
    volumes = [
        _key_volume(config),
        _secret_file_volume(ADMIN_KEY_VOLUME, config.router_admin_secret, config.router.admin_key.key),
    ]
    mounts = [
        dict(_KEY_MOUNT),
        {"name": ADMIN_KEY_VOLUME, "mountPath": commands.ADMIN_KEY_DIR, "readOnly": True},
    ]
    engine_key = config.engine_api_key
    if engine_key is not None:
        volumes.append(_secret_file_volume(ENGINE_API_KEY_VOLUME, engine_key.secret_name, engine_key.key))
        mounts.append(
            {"name": ENGINE_API_KEY_VOLUME, "mountPath": commands.ENGINE_API_KEY_DIR, "readOnly": True}
        )
    return volumes, mounts


_KEY_MOUNT: Obj = {"name": KEY_VOLUME, "mountPath": commands.KEY_DIR, "readOnly": True}


def _writable_dirs(config: CorralDeployment) -> list[tuple[str, str]]:
    """(volume name, path) of every emptyDir a read-only root filesystem needs in the engine container."""
    dirs = [(TMP_VOLUME, "/tmp")]
    if config.security.read_only_root_filesystem:
        dirs.append((HOME_VOLUME, HOME))
    dirs += [(f"writable-{i}", path) for i, path in enumerate(config.security.writable_paths)]
    return dirs


def _token_init_container(config: CorralDeployment) -> Obj:
    """Writes this pod's supervisor token (derived from the fleet key and the pod's name) to the
    memory-backed token volume, which the supervisor then reads; the key goes no further."""
    return {
        "name": "derive-token",
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": commands.derive_token_argv(config),
        "env": [
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "securityContext": _container_security(config),
        "volumeMounts": [dict(_KEY_MOUNT), {"name": TOKEN_VOLUME, "mountPath": commands.POD_TOKEN_DIR}],
    }


def _engine_volumes(config: CorralDeployment) -> tuple[list[Obj], list[Obj]]:
    volumes: list[Obj] = [
        _key_volume(config),
        {"name": TOKEN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": STATE_VOLUME, "emptyDir": {}},
    ]
    mounts: list[Obj] = [
        {"name": TOKEN_VOLUME, "mountPath": commands.POD_TOKEN_DIR, "readOnly": True},
        {"name": STATE_VOLUME, "mountPath": commands.STATE_DIR},
    ]
    for name, path in _writable_dirs(config):
        volumes.append({"name": name, "emptyDir": {}})
        mounts.append({"name": name, "mountPath": path})
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
        # the gate is the pod's data port; the engine's own port is on loopback and not offered
        "ports": [
            {"name": "http", "containerPort": config.supervisor.gate_port, "protocol": "TCP"},
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
        "securityContext": _container_security(config),
        "volumeMounts": mounts,
    }
    env = _engine_env(config)
    if env:
        container["env"] = env
    pod_spec: Obj = {
        "automountServiceAccountToken": False,  # the engine never talks to the API server
        "terminationGracePeriodSeconds": budgets.termination_grace,
        "securityContext": _pod_security(config),
        "initContainers": [_token_init_container(config)],
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
                        "corral.dev/engine-port": str(config.supervisor.gate_port),
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
                {
                    "name": "http",
                    "port": config.supervisor.gate_port,
                    "targetPort": "http",
                    "protocol": "TCP",
                },
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


def _peer(peer: PeerSpec) -> Obj:
    out: Obj = {}
    if peer.namespace_labels is not None:
        out["namespaceSelector"] = {"matchLabels": dict(peer.namespace_labels)}
    if peer.pod_labels is not None:
        out["podSelector"] = {"matchLabels": dict(peer.pod_labels)}
    return out


def engine_network_policy(config: CorralDeployment) -> Obj:
    """Only this deployment's routers reach the engine pods' gate and supervisor ports; nothing else
    reaches them at all (configured scrapers: the supervisor port only). The kubelet's probes come
    from the node, which NetworkPolicies do not block."""
    selector = commands.engine_selector(config)
    tcp = [
        {"port": config.supervisor.gate_port, "protocol": "TCP"},
        {"port": config.supervisor.port, "protocol": "TCP"},
    ]
    ingress: list[Obj] = [
        {"from": [{"podSelector": {"matchLabels": commands.router_selector(config)}}], "ports": tcp}
    ]
    peers = config.network_policy.supervisor_from
    if peers:
        ingress.append(
            {
                "from": [_peer(p) for p in peers],
                "ports": [{"port": config.supervisor.port, "protocol": "TCP"}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(config, engine_name(config), _labels(config, selector, "engine")),
        "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


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
    # /livez answers whenever the router's event loop does, to anyone (/metrics wants the admin key on
    # the pod network); /health would follow the engines, and a router taken out of its Service (or
    # restarted) because the engines are down helps no one.
    alive = _http_probe("/livez", "http", 10, 3, config.probes.timeout_seconds)
    secret_volumes, secret_mounts = _router_secret_volumes(config)
    container: Obj = {
        "name": "router",
        "image": r.image or config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": commands.router_argv(config, budgets),
        "ports": [{"name": "http", "containerPort": r.port, "protocol": "TCP"}],
        "readinessProbe": _http_probe("/livez", "http", 2, 1, config.probes.timeout_seconds),
        "livenessProbe": alive,
        # keep serving while the Service endpoint is being removed, then SIGTERM lets open streams finish
        "lifecycle": {
            "preStop": {
                "exec": {"command": ["python3", "-c", f"import time; time.sleep({ROUTER_LEAVE_SECONDS})"]}
            }
        },
        "securityContext": _container_security(config),
        "volumeMounts": [*secret_mounts, {"name": TMP_VOLUME, "mountPath": "/tmp"}],
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
                    "securityContext": _pod_security(config),
                    "containers": [container],
                    "volumes": [*secret_volumes, {"name": TMP_VOLUME, "emptyDir": {}}],
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
        *(
            [Manifest("engine-networkpolicy.yaml", engine_network_policy(config))]
            if config.network_policy.enabled
            else []
        ),
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
