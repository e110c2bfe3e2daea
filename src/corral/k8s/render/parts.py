"""The pieces every rendered object is built from: names, labels and metadata, resources, HTTP
probes, the restricted security contexts, Secret-backed volumes, the fleet key's volume and mount,
and PodDisruptionBudgets.
"""

from __future__ import annotations

from typing import Any

from corral.k8s.render import commands
from corral.k8s.render.config import CorralDeployment

Obj = dict[str, Any]


KEY_VOLUME = "corral-fleet-key"


ADMIN_KEY_VOLUME = "corral-router-admin"


ENGINE_API_KEY_VOLUME = "engine-api-key"


TENANT_KEYS_VOLUME = "corral-router-tenants"


TOKEN_VOLUME = "corral-token"


STATE_VOLUME = "corral-state"


TMP_VOLUME = "tmp"


HOME_VOLUME = "home"


SHM_VOLUME = "dshm"


BUNDLES_VOLUME = "corral-bundles"


HOME = "/home/corral"


# Where the engine's libraries write when HOME is not theirs to choose; each under the HOME emptyDir.
ENGINE_HOME_ENV = {
    "HOME": HOME,
    "XDG_CACHE_HOME": f"{HOME}/.cache",
    "HF_HOME": f"{HOME}/.cache/huggingface",
}


def object_labels(config: CorralDeployment, selector: dict[str, str], component: str) -> dict[str, str]:
    # the config's labels first, so they can never replace the ones selection depends on
    return {
        **config.labels,
        "app.kubernetes.io/name": config.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "corral",
        "app.kubernetes.io/managed-by": "corral-k8s-render",
        **selector,
    }


def object_meta(config: CorralDeployment, name: str, labels: dict[str, str]) -> Obj:
    return {"name": name, "namespace": config.namespace, "labels": labels}


def container_resources(extended: dict[str, str], cpu: str | None, memory: str | None) -> Obj:
    amounts = dict(extended)
    if cpu is not None:
        amounts["cpu"] = cpu
    if memory is not None:
        amounts["memory"] = memory
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def http_probe(path: str, port: str, period: int, failure_threshold: int, timeout: int) -> Obj:
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


def pod_security(config: CorralDeployment) -> Obj:
    sec = config.security
    context: Obj = {"runAsNonRoot": sec.run_as_non_root}
    if sec.run_as_non_root:
        # fsGroup: the fleet key (mode 0440) is readable by the group, never by the world
        context |= {"runAsUser": sec.run_as_user, "runAsGroup": sec.run_as_group, "fsGroup": sec.run_as_group}
    context["seccompProfile"] = {"type": "RuntimeDefault"}
    return context


def container_security(config: CorralDeployment) -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": config.security.read_only_root_filesystem,
        "runAsNonRoot": config.security.run_as_non_root,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def secret_file_volume(name: str, secret_name: str, key: str) -> Obj:
    """One key of a Secret as a file named after the key, readable by the pod's group only."""
    return {
        "name": name,
        "secret": {"secretName": secret_name, "items": [{"key": key, "path": key}], "defaultMode": 0o440},
    }


def key_volume(config: CorralDeployment) -> Obj:
    """The fleet key as a read-only file, for the init container that derives the pod's token and for
    the routers that derive every pod's; never for the engine container."""
    return secret_file_volume(KEY_VOLUME, config.token_secret, config.token.key)


KEY_MOUNT: Obj = {"name": KEY_VOLUME, "mountPath": commands.KEY_DIR, "readOnly": True}


def disruption_budget(
    config: CorralDeployment, name: str, selector: dict[str, str], component: str, n: int
) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(config, name, object_labels(config, selector, component)),
        "spec": {"maxUnavailable": n, "selector": {"matchLabels": selector}},
    }
