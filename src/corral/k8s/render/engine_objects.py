"""The engine's objects: its Deployment (supervisor as entrypoint, probes on /startupz, /readyz,
/livez, preStop drain, a token init container, the hardened volumes), its headless Service,
PodDisruptionBudget and NetworkPolicy, and the ConfigMap of its declared rollback bundle.
"""

from __future__ import annotations

import yaml

from corral.k8s.render import commands, kv_events_plan
from corral.k8s.render.budgets import Budgets
from corral.k8s.render.config import CorralDeployment, PeerSpec
from corral.k8s.render.kv_events_plan import KvEventsDecision
from corral.k8s.render.parts import (
    BUNDLES_VOLUME,
    ENGINE_HOME_ENV,
    HOME,
    HOME_VOLUME,
    KEY_MOUNT,
    SHM_VOLUME,
    STATE_VOLUME,
    TMP_VOLUME,
    TOKEN_VOLUME,
    Obj,
    container_resources,
    container_security,
    disruption_budget,
    engine_name,
    http_probe,
    key_volume,
    object_labels,
    object_meta,
    pod_security,
)
from corral.pod_labels import (
    KV_EVENTS_ANNOTATION,
    SERVING_GROUP_LABEL,
    SERVING_GROUP_SIZE_ANNOTATION,
    SUPERVISOR_PORT_ANNOTATION,
)


def _engine_env(config: CorralDeployment) -> list[Obj]:
    env: list[Obj] = [{"name": k, "value": v} for k, v in config.engine.env.items()]
    if config.engine.lora and commands.RUNTIME_LORA_ENV not in config.engine.env:
        env.append({"name": commands.RUNTIME_LORA_ENV, "value": "1"})  # the supervisor loads adapters
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": ref.secret_name, "key": ref.key}}}
        for k, ref in config.engine.secret_env.items()
    ]
    if config.security.read_only_root_filesystem:
        # the image's HOME (/root in vLLM's) is read-only: caches go to the HOME emptyDir, unless set
        taken = {*config.engine.env, *config.engine.secret_env}
        env += [{"name": k, "value": v} for k, v in ENGINE_HOME_ENV.items() if k not in taken]
    return env


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
        "securityContext": container_security(config),
        "volumeMounts": [dict(KEY_MOUNT), {"name": TOKEN_VOLUME, "mountPath": commands.POD_TOKEN_DIR}],
    }


def _engine_volumes(config: CorralDeployment) -> tuple[list[Obj], list[Obj]]:
    volumes: list[Obj] = [
        key_volume(config),
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
    if config.supervisor.rollback_bundle is not None:
        volumes.append({"name": BUNDLES_VOLUME, "configMap": {"name": bundles_config_map_name(config)}})
        mounts.append({"name": BUNDLES_VOLUME, "mountPath": commands.BUNDLES_DIR, "readOnly": True})
    for v in config.engine.volumes:
        volumes.append({"name": v.name, "hostPath": {"path": v.host_path, "type": v.type}})
        mount: Obj = {"name": v.name, "mountPath": v.mount_path}
        if v.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    return volumes, mounts


def engine_deployment(
    config: CorralDeployment,
    budgets: Budgets,
    *,
    name: str | None = None,
    selector: dict[str, str] | None = None,
    extra_env: tuple[Obj, ...] = (),
    extra_ports: tuple[Obj, ...] = (),
    supervisor_args: tuple[str, ...] = (),
    kv_events: KvEventsDecision | None = None,
) -> Obj:
    """The engine Deployment; a P/D fleet renders one per role, each with its own name, selector (the
    role label), the connector's env and port, and the supervisor's --role. With `kv_events` on, the
    engine publishes its KV-cache events on named ports and the pods say where (the annotation the
    router's pod source reads); either way the Deployment says why (`corral.dev/kv-events-reason`)."""
    selector = selector or commands.engine_selector(config)
    publishes = kv_events is not None and kv_events.on
    if publishes:
        config = kv_events_plan.publishing(config)
        extra_ports = (*extra_ports, *kv_events_plan.container_ports(config))
    labels = object_labels(config, selector, "engine")
    p = config.probes
    volumes, mounts = _engine_volumes(config)
    container: Obj = {
        "name": "engine",
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": commands.supervisor_argv(config, budgets, supervisor_args),
        # the gate is the pod's data port; the engine's own port is on loopback and not offered
        "ports": [
            {"name": "http", "containerPort": config.supervisor.gate_port, "protocol": "TCP"},
            {"name": "supervisor", "containerPort": config.supervisor.port, "protocol": "TCP"},
            *extra_ports,
        ],
        "resources": container_resources(
            {config.gpu.resource: str(config.engine.gpus)}, config.engine.cpu, config.engine.memory
        ),
        "startupProbe": http_probe(
            "/startupz",
            "supervisor",
            budgets.startup_period,
            budgets.startup_failure_threshold,
            p.timeout_seconds,
        ),
        "readinessProbe": http_probe(
            "/readyz",
            "supervisor",
            p.readiness_period_seconds,
            p.readiness_failure_threshold,
            p.timeout_seconds,
        ),
        "livenessProbe": http_probe(
            "/livez", "supervisor", p.liveness_period_seconds, p.liveness_failure_threshold, p.timeout_seconds
        ),
        "lifecycle": {"preStop": {"exec": {"command": commands.prestop_argv(config, budgets)}}},
        "securityContext": container_security(config),
        "volumeMounts": mounts,
    }
    env = [*_engine_env(config), *extra_env]
    if env:
        container["env"] = env
    pod_spec: Obj = {
        "automountServiceAccountToken": False,  # the engine never talks to the API server
        "terminationGracePeriodSeconds": budgets.termination_grace,
        "securityContext": pod_security(config),
        "initContainers": [_token_init_container(config)],
        "containers": [container],
        "volumes": volumes,
    }
    if config.engine.node_selector:
        pod_spec["nodeSelector"] = dict(config.engine.node_selector)
    # a serving group: every pod of the Deployment, routed to only as a whole (the router's k8s source)
    group = config.engine.serving_group
    group_labels = {SERVING_GROUP_LABEL: group} if group else {}
    group_annotations = {SERVING_GROUP_SIZE_ANNOTATION: str(config.replicas)} if group else {}
    if publishes:
        group_annotations[KV_EVENTS_ANNOTATION] = kv_events_plan.address(config).to_text()
    metadata = object_meta(config, name or engine_name(config), labels)
    if kv_events is not None:
        # on the Deployment, not its pods: a reworded reason must not roll the engines
        metadata["annotations"] = {kv_events_plan.REASON_ANNOTATION: kv_events.text()}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
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
                    "labels": {**labels, **group_labels},
                    "annotations": {
                        "corral.dev/engine-port": str(config.supervisor.gate_port),
                        SUPERVISOR_PORT_ANNOTATION: str(config.supervisor.port),
                        "corral.dev/model": config.model.served_name,
                        **group_annotations,
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def bundles_config_map_name(config: CorralDeployment) -> str:
    return f"{engine_name(config)}-bundles"


def engine_bundles_config_map(config: CorralDeployment) -> Obj:
    """The rollback bundle as the file `corral supervise --bundle` reads (name, engine_args, env)."""
    bundle = config.supervisor.rollback_bundle
    assert bundle is not None
    text = yaml.safe_dump(bundle.model_dump(mode="json"), sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(
            config,
            bundles_config_map_name(config),
            object_labels(config, commands.engine_selector(config), "engine"),
        ),
        "data": {commands.bundle_file_name(config): text},
    }


def engine_service(config: CorralDeployment) -> Obj:
    """Headless: the router finds engine pods itself; this gives them DNS names and a scrape target."""
    selector = commands.engine_selector(config)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(config, engine_name(config), object_labels(config, selector, "engine")),
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


def engine_pdb(config: CorralDeployment, budgets: Budgets) -> Obj:
    return disruption_budget(
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
    """Only this deployment's routers (and endpoint pickers, with `gateway:`; and the gateway's proxies,
    `gateway.proxy_from`, to the gate) reach the engine pods' gate and supervisor ports; nothing else
    reaches them at all (configured scrapers: the supervisor port, plus the gate port when
    monitoring.service_monitors scrapes vLLM's /metrics through it). The kubelet's probes come from
    the node, which NetworkPolicies do not block."""
    selector = commands.engine_selector(config)
    tcp = [
        {"port": config.supervisor.gate_port, "protocol": "TCP"},
        {"port": config.supervisor.port, "protocol": "TCP"},
    ]
    if kv_events_plan.any_on(config):  # the events carry prompt tokens: the routers alone read them
        tcp += kv_events_plan.policy_ports(config)
    readers = [{"podSelector": {"matchLabels": commands.router_selector(config)}}]
    if config.gateway is not None:  # the endpoint picker reads what the routers read
        readers.append({"podSelector": {"matchLabels": commands.epp_selector(config)}})
    ingress: list[Obj] = [{"from": readers, "ports": tcp}]
    if config.gateway is not None and config.gateway.proxy_from:  # the gateway sends requests to the gate
        ingress.append(
            {
                "from": [_peer(p) for p in config.gateway.proxy_from],
                "ports": [{"port": config.supervisor.gate_port, "protocol": "TCP"}],
            }
        )
    peers = config.network_policy.supervisor_from
    scrapes_gate = config.monitoring.service_monitors
    if peers:
        ingress.append(
            {
                "from": [_peer(p) for p in peers],
                "ports": [
                    {"port": config.supervisor.port, "protocol": "TCP"},
                    # ServiceMonitors scrape vLLM's /metrics through the gate too
                    *([{"port": config.supervisor.gate_port, "protocol": "TCP"}] if scrapes_gate else []),
                ],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(config, engine_name(config), object_labels(config, selector, "engine")),
        "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress"], "ingress": ingress},
    }
