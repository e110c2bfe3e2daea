"""The rendered pods are hardened: every container runs with a restricted securityContext and a
read-only root filesystem (the paths that must be writable are emptyDir volumes), hostPath volumes
are read-only unless the config says otherwise, the engine listens on loopback behind the
supervisor's admission gate, a NetworkPolicy lets only the routers reach the gate and the supervisor,
and each supervisor's token is derived per pod by an init container from a fleet key that only the
init container and the router mount: the engine container holds neither the key nor it in its env."""

from __future__ import annotations

import copy
from pathlib import PurePosixPath
from typing import Any

import click
import pytest

from corral.k8s.render.commands import router_selector
from corral.k8s.render.config_reading import ConfigError
from corral.router.cli import router as router_command
from corral.supervisor.cli import prestop as prestop_command
from corral.supervisor.cli import run_command as supervise_run_command
from tests.unit.test_k8s_render_manifests import build, by_file, seed, variant

Obj = dict[str, Any]
CASES = [seed(), variant()]
IDS = ["wait-for-kv-cache", "variant"]


def _parse(command: click.Command, args: list[str]) -> dict[str, Any]:
    with click.Context(command) as parent:
        ctx = command.make_context(command.name, list(args), parent=parent)
    return dict(ctx.params)


def pod_templates(data: dict[str, Any]) -> dict[str, Obj]:
    _, _, manifests = build(data)
    return {m.obj["metadata"]["name"]: m.obj["spec"]["template"] for m in manifests if m.kind == "Deployment"}


def engine_pod(data: dict[str, Any]) -> Obj:
    _, _, manifests = build(data)
    pod: Obj = by_file(manifests)["engine-deployment.yaml"]["spec"]["template"]
    return pod


def router_pod(data: dict[str, Any]) -> Obj:
    _, _, manifests = build(data)
    pod: Obj = by_file(manifests)["router-deployment.yaml"]["spec"]["template"]
    return pod


def all_containers(pod: Obj) -> list[Obj]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def main_container(pod: Obj) -> Obj:
    container: Obj = pod["spec"]["containers"][0]
    return container


def volumes(pod: Obj) -> dict[str, Obj]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def mount_of(container: Obj, path: str) -> Obj | None:
    """The volume mount that holds `path` in `container` (the deepest one), if any."""
    target = PurePosixPath(path)
    best: Obj | None = None
    for m in container.get("volumeMounts", []):
        mount = PurePosixPath(m["mountPath"])
        if (target == mount or mount in target.parents) and (
            best is None or len(m["mountPath"]) > len(best["mountPath"])
        ):
            best = m
    return best


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# -- securityContext --------------------------------------------------------------------------------


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_every_pod_and_container_runs_restricted(data: dict[str, Any]) -> None:
    templates = pod_templates(data)
    assert len(templates) == 2
    for name, pod in templates.items():
        pod_ctx = pod["spec"]["securityContext"]
        assert pod_ctx["runAsNonRoot"] is True, name
        assert pod_ctx["runAsUser"] >= 1, name
        assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}, name
        containers = all_containers(pod)
        assert containers
        for c in containers:
            ctx = c["securityContext"]
            where = f"{name}/{c['name']}"
            assert ctx["allowPrivilegeEscalation"] is False, where
            assert ctx["capabilities"] == {"drop": ["ALL"]}, where
            assert ctx["readOnlyRootFilesystem"] is True, where
            assert ctx["runAsNonRoot"] is True, where
            assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert "privileged" not in ctx or ctx["privileged"] is False, where


def test_run_as_root_is_a_documented_switch_not_a_default() -> None:
    data = copy.deepcopy(seed())
    data["security"] = {"run_as_non_root": False}
    for pod in pod_templates(data).values():
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is False
        assert "runAsUser" not in pod["spec"]["securityContext"]
        for c in all_containers(pod):
            # the rest of the restriction stays
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    data["security"] = {"run_as_user": 0}
    with pytest.raises(ConfigError, match=r"security\.run_as_user"):
        build(data)


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_the_paths_the_engine_writes_are_emptydir_volumes(data: dict[str, Any]) -> None:
    pod = engine_pod(data)
    container = main_container(pod)
    vols = volumes(pod)
    argv = container["command"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    writable = {
        "/tmp": "/tmp",
        "--state-dir": flag(argv, "--state-dir"),
        "HOME": env.get("HOME"),
        "HF_HOME": env.get("HF_HOME"),
        "XDG_CACHE_HOME": env.get("XDG_CACHE_HOME"),
    }
    for what, path in writable.items():
        assert path, f"{what} is not set"
        mount = mount_of(container, path)
        assert mount is not None, f"{what} {path} is on the read-only root filesystem"
        assert not mount.get("readOnly"), f"{what} {path} is on a read-only mount"
        assert "emptyDir" in vols[mount["name"]], f"{what} {path} is not on an emptyDir"
    for c in pod["spec"].get("initContainers", []):
        for m in c.get("volumeMounts", []):
            if not m.get("readOnly"):
                assert "emptyDir" in vols[m["name"]], f"init container writes to {m['mountPath']}"


# -- hostPath ---------------------------------------------------------------------------------------


def test_hostpath_volumes_are_read_only_by_default() -> None:
    pod = engine_pod(seed())
    container = main_container(pod)
    host = {name for name, v in volumes(pod).items() if "hostPath" in v}
    assert host == {"models", "kvcache-socket"}
    for m in container["volumeMounts"]:
        if m["name"] in host:
            assert m.get("readOnly") is True, m
    model_mount = mount_of(container, seed()["model"]["path"])
    assert model_mount is not None and model_mount["name"] == "models" and model_mount["readOnly"] is True


def test_a_hostpath_volume_is_writable_only_when_the_config_says_so() -> None:
    data = copy.deepcopy(seed())
    data["engine"]["volumes"][0]["read_only"] = False
    container = main_container(engine_pod(data))
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert not mounts["models"].get("readOnly")
    assert mounts["kvcache-socket"]["readOnly"] is True


# -- loopback engine behind the admission gate ------------------------------------------------------


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_engine_is_on_loopback_behind_the_admission_gate(data: dict[str, Any]) -> None:
    config, _, manifests = build(data)
    objs = by_file(manifests)
    pod = engine_pod(data)
    container = main_container(pod)
    argv = container["command"]
    params = _parse(supervise_run_command, argv[3:])
    engine = list(params["engine_command"])
    assert flag(engine, "--host") == "127.0.0.1"
    engine_port = int(flag(engine, "--port"))
    assert params["engine_url"] == f"http://127.0.0.1:{engine_port}"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert params["gate_port"] == ports["http"]
    assert params["gate_port"] != engine_port
    assert engine_port not in ports.values()  # the engine's own port is not offered to the pod network
    # the router and the Service send the data path to the gate
    router_params = _parse(router_command, main_container(router_pod(data))["command"][2:])
    assert router_params["engine_port"] == params["gate_port"]
    service_ports = {p["name"]: p for p in objs["engine-service.yaml"]["spec"]["ports"]}
    assert service_ports["http"]["port"] == params["gate_port"]
    assert pod["metadata"]["annotations"]["corral.dev/engine-port"] == str(params["gate_port"])
    # the probes ask the supervisor, never the engine
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "supervisor"
    assert config.engine.port == engine_port


def test_engine_flags_the_gate_owns_are_refused_in_args() -> None:
    data = copy.deepcopy(seed())
    data["engine"]["args"] = ["--host", "0.0.0.0"]
    with pytest.raises(ConfigError, match=r"127\.0\.0\.1"):
        build(data)
    data = copy.deepcopy(seed())
    data["supervisor"] = {"gate_port": data["engine"]["port"]}
    with pytest.raises(ConfigError, match=r"supervisor\.gate_port"):
        build(data)


# -- NetworkPolicy ----------------------------------------------------------------------------------


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_network_policy_lets_only_routers_reach_the_gate_and_the_supervisor(data: dict[str, Any]) -> None:
    config, _, manifests = build(data)
    policies = [m.obj for m in manifests if m.kind == "NetworkPolicy"]
    assert len(policies) == 1
    spec = policies[0]["spec"]
    engine = by_file(manifests)["engine-deployment.yaml"]
    assert spec["podSelector"] == {"matchLabels": engine["spec"]["selector"]["matchLabels"]}
    assert spec["policyTypes"] == ["Ingress"]
    ports = {p["name"]: p["containerPort"] for p in main_container(engine["spec"]["template"])["ports"]}
    router_labels = router_pod(data)["metadata"]["labels"]
    reachable: set[int] = set()
    for rule in spec["ingress"]:
        assert rule.get("from"), f"a rule without `from` admits every peer: {rule}"
        assert rule.get("ports"), f"a rule without `ports` opens every port: {rule}"
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"}, f"only pods of this namespace: {peer}"
            assert peer["podSelector"] == {"matchLabels": router_selector(config)}
            assert router_selector(config).items() <= router_labels.items()
        for port in rule["ports"]:
            assert port["protocol"] == "TCP"
            reachable.add(port["port"])
    assert reachable == {ports["http"], ports["supervisor"]}
    assert config.engine.port not in reachable


def test_network_policy_peers_for_scraping_reach_only_the_supervisor_port() -> None:
    data = copy.deepcopy(seed())
    data["network_policy"] = {"supervisor_from": [{"namespace_labels": {"name": "monitoring"}}]}
    config, _, manifests = build(data)
    spec = next(m.obj for m in manifests if m.kind == "NetworkPolicy")["spec"]
    extra = [
        r
        for r in spec["ingress"]
        if r["from"][0] != {"podSelector": {"matchLabels": router_selector(config)}}
    ]
    assert extra == [
        {
            "from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
            "ports": [{"port": config.supervisor.port, "protocol": "TCP"}],
        }
    ]
    data["network_policy"] = {"enabled": False}
    _, _, manifests = build(data)
    assert "NetworkPolicy" not in {m.kind for m in manifests}


# -- per-pod tokens ---------------------------------------------------------------------------------


def _env_source(env: Obj) -> str:
    ref = env.get("valueFrom", {}).get("fieldRef", {})
    return str(ref.get("fieldPath", ""))


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_an_init_container_derives_the_pods_token_from_the_fleet_key(data: dict[str, Any]) -> None:
    config, _, _ = build(data)
    pod = engine_pod(data)
    vols = volumes(pod)
    inits = pod["spec"]["initContainers"]
    assert len(inits) == 1
    init = inits[0]
    argv = init["command"]
    assert argv[:3] == ["corral", "supervise", "derive-token"]
    from corral.supervisor.cli import derive_token as derive_token_command  # new with per-pod tokens

    params = _parse(derive_token_command, argv[3:])
    # the key comes from the fleet key Secret, mounted read-only into the init container
    key_mount = mount_of(init, str(params["key_file"]))
    assert key_mount is not None and key_mount["readOnly"] is True
    assert vols[key_mount["name"]]["secret"]["secretName"] == config.token_secret
    # the pod's own namespace and name, from the downward API
    env = {e["name"]: _env_source(e) for e in init["env"]}
    assert params["namespace"] == "$(POD_NAMESPACE)" and env["POD_NAMESPACE"] == "metadata.namespace"
    assert params["pod_name"] == "$(POD_NAME)" and env["POD_NAME"] == "metadata.name"
    # written to a memory-backed emptyDir the supervisor reads, and the prestop hook too
    out = str(params["out"])
    out_mount = mount_of(init, out)
    assert out_mount is not None and not out_mount.get("readOnly")
    assert vols[out_mount["name"]]["emptyDir"]["medium"] == "Memory"
    container = main_container(pod)
    assert flag(container["command"], "--token-file") == out
    prestop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert str(_parse(prestop_command, prestop[3:])["token_file"]) == out
    main_mount = mount_of(container, out)
    assert main_mount is not None and main_mount["name"] == out_mount["name"]


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_the_engine_container_holds_neither_the_fleet_key_nor_a_token_in_its_env(
    data: dict[str, Any],
) -> None:
    config, _, _ = build(data)
    pod = engine_pod(data)
    vols = volumes(pod)
    container = main_container(pod)
    for m in container["volumeMounts"]:
        assert "secret" not in vols[m["name"]], f"the engine container mounts Secret volume {m['name']}"
    for env in container.get("env", []):
        assert env["name"] not in ("CORRAL_TOKEN", "CORRAL_FLEET_KEY")
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        assert ref is None or ref["name"] != config.token_secret, env
    for c in all_containers(pod):
        for env in c.get("env", []):
            assert "value" not in env or not any(w in env["name"] for w in ("TOKEN", "FLEET_KEY"))
    # the only container of the engine pod that mounts the key is the init container
    key_holders = [
        c["name"]
        for c in all_containers(pod)
        for m in c.get("volumeMounts", [])
        if vols[m["name"]].get("secret", {}).get("secretName") == config.token_secret
    ]
    assert key_holders == [pod["spec"]["initContainers"][0]["name"]]


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_the_router_derives_each_pods_token_from_the_fleet_key(data: dict[str, Any]) -> None:
    config, _, _ = build(data)
    pod = router_pod(data)
    container = main_container(pod)
    params = _parse(router_command, container["command"][2:])
    assert params["supervisor_token_file"] is None
    key_file = str(params["supervisor_token_key_file"])
    mount = mount_of(container, key_file)
    assert mount is not None and mount["readOnly"] is True
    assert volumes(pod)[mount["name"]]["secret"]["secretName"] == config.token_secret
    assert all("CORRAL_TOKEN" != e["name"] for e in container.get("env", []))


@pytest.mark.parametrize("mount_path", ["/etc", "/etc/corral", "/var/lib/corral", "/tmp", "/home"])
def test_a_volume_that_would_hide_a_corral_path_is_refused(mount_path: str) -> None:
    data = copy.deepcopy(seed())
    data["engine"]["volumes"][0]["mount_path"] = mount_path
    with pytest.raises(ConfigError, match=r"engine\.volumes\[0\]\.mount_path.*would hide"):
        build(data)


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ({}, r"supervisor_from.*names no peer"),
        ({"pod_labels": {"app": "bad value!"}}, r"pod_labels.*not a label value"),
    ],
)
def test_a_bad_network_policy_peer_is_refused(peer: dict[str, Any], expected: str) -> None:
    data = copy.deepcopy(seed())
    data["network_policy"] = {"supervisor_from": [peer]}
    with pytest.raises(ConfigError, match=expected):
        build(data)


def test_writable_paths_are_emptydirs_and_relative_ones_are_refused() -> None:
    data = copy.deepcopy(seed())
    data["security"] = {"writable_paths": ["/workspace", "/opt/cache"]}
    pod = engine_pod(data)
    container = main_container(pod)
    for path in ("/workspace", "/opt/cache"):
        mount = mount_of(container, path)
        assert mount is not None and mount["mountPath"] == path and not mount.get("readOnly")
        assert volumes(pod)[mount["name"]] == {"name": mount["name"], "emptyDir": {}}
    data["security"] = {"writable_paths": ["workspace"]}
    with pytest.raises(ConfigError, match=r"security\.writable_paths.*not an absolute path"):
        build(data)
