"""Rendered manifests validate against the Kubernetes schemas (kubernetes-validate, offline, strict),
their command lines parse with Corral's own CLIs, the router finds exactly the engine pods, no secret
value is written, and the committed wait-for-kv-cache rendering equals a fresh one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from corral.cli import main
from corral.k8s.render.budgets import Budgets, derive
from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.config_reading import parse_config
from corral.k8s.render.manifests import Manifest, render
from corral.k8s.render.output import HEADER, document, write_dir
from corral.pod_labels import SUPERVISOR_PORT_ANNOTATION
from corral.router.cli import router as router_command
from corral.supervisor.cli import prestop as prestop_command
from corral.supervisor.cli import run_command as supervise_run_command

KUBERNETES = "1.30.0"  # the oldest Kubernetes the manifests must apply to; schemas ship in the package
EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "wait-for-kv-cache"
SEED = EXAMPLE / "corral.yaml"
RENDERED = EXAMPLE / "rendered"
_EXAMPLE_DIR = "deploy/examples/wait-for-kv-cache"
REGENERATE = f"corral k8s render --config {_EXAMPLE_DIR}/corral.yaml --out {_EXAMPLE_DIR}/rendered"
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"  # a made-up 40-hex hub commit


def seed() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(SEED.read_text(encoding="utf-8"))
    return data


def variant() -> dict[str, Any]:
    """Everything the seed does not use: tensor parallel, a download, Secret env, abort, no gates."""
    data = copy.deepcopy(seed())
    data.update(name="qwen-72b", namespace="inference", replicas=3, labels={})
    data["engine"] = {
        "launcher": "vllm-serve",
        "tensor_parallel_size": 4,
        "args": ["--max-model-len", "32768"],
        "secret_env": {"HF_TOKEN": {"secret_name": "hf", "key": "token"}},
        "shm_size": None,
    }
    data["model"] = {
        "path": "Qwen/Qwen2.5-72B-Instruct",
        "revision": HUB_COMMIT,  # a hub id must be pinned (PRECHECK refuses a floating revision)
        "served_name": "qwen-72b",
        "weights_gib": 136,
    }
    data["gpu"] = {"capacity": 12}
    data["dependencies"] = {}
    data["startup"] = {"download_gbps": 0.5, "read_gbps": 2.0, "compile_seconds": 120}
    data["drain"] = {"policy": "abort", "longest_stream_seconds": 120}
    data["router"] = {"replicas": 1}
    data["token"] = {"secret_name": "fleet-token", "key": "mgmt"}
    return data


def build(data: dict[str, Any]) -> tuple[CorralDeployment, Budgets, list[Manifest]]:
    config = parse_config(data)
    budgets = derive(config)
    return config, budgets, render(config, budgets)


def by_file(manifests: list[Manifest]) -> dict[str, dict[str, Any]]:
    return {m.filename: m.obj for m in manifests}


def engine_container(manifests: list[Manifest]) -> dict[str, Any]:
    container: dict[str, Any] = by_file(manifests)["engine-deployment.yaml"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    return container


@pytest.mark.parametrize("data", [seed(), variant()], ids=["wait-for-kv-cache", "variant"])
def test_every_object_validates_against_the_kubernetes_schema(data: dict[str, Any]) -> None:
    _, _, manifests = build(data)
    assert len(manifests) >= 8
    for m in manifests:
        # through YAML and back, as kubectl would read it
        obj = yaml.safe_load(yaml.safe_dump(m.obj))
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def test_the_validator_is_strict_enough_to_catch_a_typo() -> None:
    _, _, manifests = build(seed())
    broken = copy.deepcopy(by_file(manifests)["engine-deployment.yaml"])
    broken["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["failureTreshold"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_committed_example_rendering_is_current() -> None:
    config, _, manifests = build(seed())
    committed = {p.name: p.read_text(encoding="utf-8") for p in sorted(RENDERED.glob("*.yaml"))}
    assert sorted(committed) == sorted(m.filename for m in manifests), f"stale: run `{REGENERATE}`"
    for m in manifests:
        assert committed[m.filename] == document(config, m), f"{m.filename} is stale: run `{REGENERATE}`"


def test_committed_example_rendering_validates_as_read_from_disk() -> None:
    for path in sorted(RENDERED.glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def _parse(command: click.Command, args: list[str]) -> dict[str, Any]:
    """The parameters `command` would run with: parsed and type-checked by the real CLI, not run."""
    with click.Context(command) as parent:
        ctx = command.make_context(command.name, list(args), parent=parent)
    return dict(ctx.params)


@pytest.mark.parametrize("data", [seed(), variant()], ids=["wait-for-kv-cache", "variant"])
def test_supervisor_entrypoint_parses_and_carries_the_budgets(data: dict[str, Any]) -> None:
    config, budgets, manifests = build(data)
    command = engine_container(manifests)["command"]
    assert command[:3] == ["corral", "supervise", "run"]
    params = _parse(supervise_run_command, command[3:])
    assert params["wait_for"] == tuple(config.dependencies.wait_for)
    assert params["startup_timeout"] == budgets.startup_timeout
    assert params["dependency_timeout"] == config.dependencies.timeout_seconds
    assert params["startup_restarts"] == config.startup.restarts
    assert params["drain_timeout"] == config.drain.longest_stream_seconds
    assert params["drain_policy"] == config.drain.policy
    assert params["propagation_timeout"] == budgets.propagation_timeout
    assert params["shutdown_timeout"] == config.drain.engine_shutdown_seconds
    assert params["port"] == config.supervisor.port
    assert params["model"] == config.model.served_name
    engine = params["engine_command"]
    assert engine[engine.index("--port") + 1] == str(config.engine.port)
    assert engine[engine.index("--tensor-parallel-size") + 1] == str(config.engine.tensor_parallel_size)


def test_example_engine_waits_for_the_kv_cache_socket_and_rpc_endpoint() -> None:
    _, _, manifests = build(seed())
    command = engine_container(manifests)["command"]
    gates = [command[i + 1] for i, arg in enumerate(command) if arg == "--wait-for"]
    assert gates == ["unix:/var/run/vineyard.sock", "tcp:aibrix-kvcache-llama-3-8b-instruct-rpc:9600"]
    # the gates come before `--`: the supervisor waits, the engine is not started until they open
    assert command.index("--") > max(i for i, arg in enumerate(command) if arg == "--wait-for")
    assert command[command.index("--") + 1 :][:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]


@pytest.mark.parametrize("data", [seed(), variant()], ids=["wait-for-kv-cache", "variant"])
def test_probes_and_prestop_follow_the_budgets(data: dict[str, Any]) -> None:
    config, budgets, manifests = build(data)
    container = engine_container(manifests)
    pod = by_file(manifests)["engine-deployment.yaml"]["spec"]["template"]["spec"]
    supervisor_port = {p["name"]: p["containerPort"] for p in container["ports"]}["supervisor"]
    assert supervisor_port == config.supervisor.port
    startup, ready, live = (container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe"))
    assert [p["httpGet"]["path"] for p in (startup, ready, live)] == ["/startupz", "/readyz", "/livez"]
    assert {p["httpGet"]["port"] for p in (startup, ready, live)} == {"supervisor"}
    assert startup["failureThreshold"] * startup["periodSeconds"] >= budgets.startup_window
    assert (startup["failureThreshold"] - 1) * startup["periodSeconds"] >= budgets.startup_window
    assert budgets.startup_window >= budgets.startup_timeout
    prestop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert prestop[:3] == ["corral", "supervise", "prestop"]
    params = _parse(prestop_command, prestop[3:])
    assert params["timeout"] == budgets.prestop_timeout
    assert params["url"] == f"http://127.0.0.1:{config.supervisor.port}"
    assert pod["terminationGracePeriodSeconds"] == budgets.termination_grace > params["timeout"]
    dep = by_file(manifests)["engine-deployment.yaml"]["spec"]
    assert dep["progressDeadlineSeconds"] > budgets.startup_window


def test_rendered_grace_and_probe_move_with_the_config() -> None:
    _, _, base = build(seed())
    data = copy.deepcopy(seed())
    data["drain"]["longest_stream_seconds"] = 1200
    data["startup"]["warmup_seconds"] = 330
    _, _, moved = build(data)
    base_pod = by_file(base)["engine-deployment.yaml"]["spec"]["template"]["spec"]
    moved_pod = by_file(moved)["engine-deployment.yaml"]["spec"]["template"]["spec"]
    assert moved_pod["terminationGracePeriodSeconds"] - base_pod["terminationGracePeriodSeconds"] == 900
    base_ft = base_pod["containers"][0]["startupProbe"]["failureThreshold"]
    moved_ft = moved_pod["containers"][0]["startupProbe"]["failureThreshold"]
    # +300 s warmup × 2 loads × 1.5 margin = +900 s of window = +90 probes at 10 s
    assert moved_ft - base_ft == 90


# the example runs 2 engines of 1 GPU: 2 spare GPUs surge 2, 1 surges 1, none takes one down first
@pytest.mark.parametrize(("capacity", "surge", "unavailable"), [(4, 2, 0), (3, 1, 0), (2, 0, 1)])
def test_rolling_update_in_the_deployment_comes_from_gpu_capacity(
    capacity: int, surge: int, unavailable: int
) -> None:
    data = copy.deepcopy(seed())
    data["gpu"]["capacity"] = capacity
    _, _, manifests = build(data)
    strategy = by_file(manifests)["engine-deployment.yaml"]["spec"]["strategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable},
    }


def test_gpu_request_is_tensor_times_pipeline_parallel() -> None:
    data = variant()
    data["engine"]["pipeline_parallel_size"] = 2
    data["replicas"] = 1
    _, _, manifests = build(data)
    resources = engine_container(manifests)["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == "8"


def _selector(text: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in text.split(","))


@pytest.mark.parametrize("data", [seed(), variant()], ids=["wait-for-kv-cache", "variant"])
def test_router_discovers_exactly_the_engine_pods(data: dict[str, Any]) -> None:
    config, _, manifests = build(data)
    objs = by_file(manifests)
    engine_pod = objs["engine-deployment.yaml"]["spec"]["template"]
    router_pod = objs["router-deployment.yaml"]["spec"]["template"]
    args = router_pod["spec"]["containers"][0]["command"]
    assert args[:2] == ["corral", "router"]
    params = _parse(router_command, args[2:])
    assert params["discovery"] == "k8s"
    assert params["namespace"] == config.namespace
    selector = _selector(params["selector"])
    assert selector.items() <= engine_pod["metadata"]["labels"].items()
    assert not selector.items() <= router_pod["metadata"]["labels"].items()
    engine_ports = {p["name"]: p["containerPort"] for p in engine_pod["spec"]["containers"][0]["ports"]}
    assert params["engine_port"] == engine_ports["http"] == config.supervisor.gate_port
    assert params["request_timeout"] == config.drain.longest_stream_seconds
    # it follows every pod's supervisor state stream, where the supervisor listens, with the pod's
    # token, derived from the fleet key that the pod's init container derives it from too
    assert params["supervisor_port"] == engine_ports["supervisor"]
    annotations = engine_pod["metadata"]["annotations"]
    assert annotations[SUPERVISOR_PORT_ANNOTATION] == str(engine_ports["supervisor"])
    key_path = str(params["supervisor_token_key_file"])
    init_args = engine_pod["spec"]["initContainers"][0]["command"]
    assert key_path == init_args[init_args.index("--key-file") + 1]
    router_mounts = router_pod["spec"]["containers"][0]["volumeMounts"]
    router_volumes = {v["name"]: v for v in router_pod["spec"]["volumes"]}
    mount = next(m for m in router_mounts if key_path.startswith(m["mountPath"] + "/"))
    assert router_volumes[mount["name"]]["secret"]["secretName"] == config.token_secret
    assert router_pod["spec"]["terminationGracePeriodSeconds"] > params["shutdown_timeout"]
    # and the Deployment, Service and PDB select the same pods
    for name in ("engine-deployment.yaml", "engine-pdb.yaml"):
        assert objs[name]["spec"]["selector"]["matchLabels"] == selector
    assert objs["engine-service.yaml"]["spec"]["selector"] == selector


def test_router_rbac_lists_and_watches_pods_in_its_namespace_only() -> None:
    config, _, manifests = build(seed())
    objs = by_file(manifests)
    role, binding = objs["router-role.yaml"], objs["router-rolebinding.yaml"]
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == config.namespace
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    account = objs["router-serviceaccount.yaml"]["metadata"]["name"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": config.namespace}]
    router_pod = objs["router-deployment.yaml"]["spec"]["template"]["spec"]
    assert router_pod["serviceAccountName"] == account
    engine_pod = objs["engine-deployment.yaml"]["spec"]["template"]["spec"]
    assert engine_pod["automountServiceAccountToken"] is False


def test_pdbs() -> None:
    _, _, manifests = build(seed())
    objs = by_file(manifests)
    assert objs["engine-pdb.yaml"]["spec"]["maxUnavailable"] == 1
    assert objs["router-pdb.yaml"]["spec"]["maxUnavailable"] == 1
    _, _, single_router = build(variant())
    assert "router-pdb.yaml" not in by_file(single_router)


def _strings(obj: Any) -> list[str]:
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return [obj] if isinstance(obj, str) else []


def test_token_is_a_mounted_secret_file_never_a_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sentinel = "s3cr3t-management-token-value"
    monkeypatch.setenv("CORRAL_TOKEN", sentinel)
    config_path = tmp_path / "corral.yaml"
    config_path.write_text(yaml.safe_dump(variant()), encoding="utf-8")
    result = CliRunner().invoke(main, ["k8s", "render", "--config", str(config_path)])
    assert result.exit_code == 0, result.output
    assert sentinel not in result.output
    objs = list(yaml.safe_load_all(result.stdout))
    assert "Secret" not in {o["kind"] for o in objs}
    engine = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-engine"))
    pod = engine["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "--token" not in container["command"]
    token_file = container["command"][container["command"].index("--token-file") + 1]
    assert token_file == "/etc/corral/pod-token/token"  # this pod's own, derived by the init container
    prestop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert prestop[prestop.index("--token-file") + 1] == token_file
    init = pod["initContainers"][0]
    key_file = init["command"][init["command"].index("--key-file") + 1]
    assert key_file == "/etc/corral/fleet-key/mgmt"
    assert init["command"][init["command"].index("--out") + 1] == token_file
    volume = next(v for v in pod["volumes"] if "secret" in v)
    assert volume["secret"]["secretName"] == "fleet-token"
    mount = next(m for m in init["volumeMounts"] if m["name"] == volume["name"])
    assert mount["readOnly"] is True and key_file.startswith(mount["mountPath"] + "/")
    assert all(m["name"] != volume["name"] for m in container["volumeMounts"])
    # secrets given to the engine are references only
    for env in container.get("env", []):
        assert "value" not in env or not any(w in env["name"] for w in ("TOKEN", "KEY", "SECRET"))
    hf = next(e for e in container["env"] if e["name"] == "HF_TOKEN")
    assert hf == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert not any("CORRAL_TOKEN" in s for s in _strings(objs))


def test_cli_writes_one_file_per_object_and_removes_only_its_own_stale_files(tmp_path: Path) -> None:
    out = tmp_path / "rendered"
    out.mkdir()
    (out / "router-pdb.yaml").write_text(HEADER + "\nkind: Stale\n", encoding="utf-8")
    (out / "mine.yaml").write_text("kind: KeepMe\n", encoding="utf-8")
    config_path = tmp_path / "corral.yaml"
    config_path.write_text(yaml.safe_dump(variant()), encoding="utf-8")
    result = CliRunner().invoke(main, ["k8s", "render", "--config", str(config_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.glob("*.yaml"))
    assert "router-pdb.yaml" not in names  # one router replica: no PDB any more
    assert "mine.yaml" in names
    # the printed answer is the contract: what the person who ran the command reads
    assert "kubectl -n inference create secret generic fleet-token" in result.stderr


def test_explain_shows_the_arithmetic(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["k8s", "render", "--config", str(SEED), "--explain"])
    assert result.exit_code == 0
    # the printed answer is the contract: what the person who ran the command reads
    assert "terminationGracePeriodSeconds" in result.stderr
    assert "ceil(1.5 × (download 0 + (1 + 1 restarts) × 146.1) + backoffs 1)" in result.stderr
    assert result.stdout.startswith(HEADER)


def test_example_readme_shows_the_current_arithmetic() -> None:
    readme = (EXAMPLE / "README.md").read_text(encoding="utf-8")
    shown = {" ".join(line.split()) for line in readme.splitlines()}
    result = CliRunner().invoke(main, ["k8s", "render", "--config", str(SEED), "--explain"])
    steps = [line for line in result.stderr.splitlines() if line.startswith("  ")]
    assert steps
    for line in steps:
        assert " ".join(line.split()) in shown, f"README.md is stale: {line.strip()}"


def test_write_dir_output_matches_stream(tmp_path: Path) -> None:
    config, _, manifests = build(seed())
    write_dir(tmp_path, config, manifests)
    result = CliRunner().invoke(main, ["k8s", "render", "--config", str(SEED)])
    from_files = [yaml.safe_load((tmp_path / m.filename).read_text(encoding="utf-8")) for m in manifests]
    # the printed answer is the contract: what the person who ran the command reads
    assert list(yaml.safe_load_all(result.stdout)) == from_files
