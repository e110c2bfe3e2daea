"""A P/D `corral.yaml` renders one engine Deployment and PDB per role (label corral.dev/role), each
role's surge from its own spare GPUs, the connector config in every engine's command (and so in its
bundle fingerprint), NIXL's side channel open only between the fleet's engine pods, and a router that
discovers both roles; bad P/D configs name the field, the value and what to do."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from corral.cli import main
from corral.k8s.render.budgets import derive
from corral.k8s.render.config_reading import ConfigError, load_config, parse_config
from corral.k8s.render.manifests import Manifest, render
from corral.k8s.render.output import document
from corral.router.cli import router as router_command
from corral.router.discovery.k8s_pods import pod_view
from corral.supervisor.checks.bundle import bundle_from
from corral.supervisor.cli import run_command as supervise_run_command

KUBERNETES = "1.30.0"
EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "pd"
REGENERATE = "corral k8s render --config deploy/examples/pd/corral.yaml --out deploy/examples/pd/rendered"


def example() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLE / "corral.yaml").read_text(encoding="utf-8"))
    return data


def objects(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    config = parse_config(copy.deepcopy(data))
    return {m.filename: m.obj for m in render(config, derive(config))}


def _parse(command: click.Command, args: list[str]) -> dict[str, Any]:
    with click.Context(command) as parent:
        ctx = command.make_context(command.name, list(args), parent=parent)
    return dict(ctx.params)


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def _engine_argv(deployment: dict[str, Any]) -> list[str]:
    command: list[str] = _container(deployment)["command"]
    return command[command.index("--") + 1 :]


def test_every_object_validates_and_the_committed_rendering_is_current() -> None:
    config = load_config(EXAMPLE / "corral.yaml")
    manifests: list[Manifest] = render(config, derive(config))
    committed = {p.name: p.read_text(encoding="utf-8") for p in (EXAMPLE / "rendered").glob("*.yaml")}
    assert sorted(committed) == sorted(m.filename for m in manifests), f"stale: run `{REGENERATE}`"
    for m in manifests:
        kubernetes_validate.validate(m.obj, KUBERNETES, strict=True)
        assert committed[m.filename] == document(config, m), f"{m.filename} is stale: run `{REGENERATE}`"
    assert "engine-deployment.yaml" not in committed and "engine-pdb.yaml" not in committed


def test_one_deployment_and_pdb_per_role_with_the_role_label() -> None:
    objs = objects(example())
    for role, replicas in (("prefill", 2), ("decode", 2)):
        deployment, pdb = objs[f"{role}-deployment.yaml"], objs[f"{role}-pdb.yaml"]
        assert deployment["metadata"]["name"] == f"llama-3-8b-pd-{role}"
        assert deployment["spec"]["replicas"] == replicas
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector == {"corral.dev/deployment": "llama-3-8b-pd", "corral.dev/role": role}
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        assert pdb["spec"]["selector"]["matchLabels"] == selector
        assert pdb["spec"]["maxUnavailable"] == 1
    # the two Deployments never select each other's pods
    prefill = objs["prefill-deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    decode_selector = objs["decode-deployment.yaml"]["spec"]["selector"]["matchLabels"]
    assert not decode_selector.items() <= prefill.items()


def test_surge_comes_from_each_roles_own_spare_gpus() -> None:
    objs = objects(example())
    # prefill: 3 GPUs for 2 engines → one surges, none is lost; decode: 2 for 2 → one at a time
    prefill = objs["prefill-deployment.yaml"]["spec"]["strategy"]["rollingUpdate"]
    decode = objs["decode-deployment.yaml"]["spec"]["strategy"]["rollingUpdate"]
    assert prefill == {"maxSurge": 1, "maxUnavailable": 0}
    assert decode == {"maxSurge": 0, "maxUnavailable": 1}
    data = example()
    data["pd"]["decode"]["gpu_capacity"] = 4
    data["pd"]["prefill"]["max_unavailable"] = 2
    objs = objects(data)
    assert objs["decode-deployment.yaml"]["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 2,
        "maxUnavailable": 0,
    }
    assert objs["prefill-pdb.yaml"]["spec"]["maxUnavailable"] == 2
    assert objs["decode-pdb.yaml"]["spec"]["maxUnavailable"] == 1


def test_the_connector_is_in_every_engine_command_and_its_fingerprint() -> None:
    objs = objects(example())
    prints = {}
    for role in ("prefill", "decode"):
        argv = _engine_argv(objs[f"{role}-deployment.yaml"])
        kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        # the supervisor's own parser takes the rendered command as it is
        params = _parse(supervise_run_command, _container(objs[f"{role}-deployment.yaml"])["command"][3:])
        assert list(params["engine_command"]) == argv
        # kv_both says no role: the supervisor is told it, and publishes it to the routers
        assert params["role"] == role
        bundle = bundle_from(argv, "0.11.0", [{"id": "llama-3-8b-instruct"}])
        assert bundle.parts["command"]["kv_transfer_config"] == argv[argv.index("--kv-transfer-config") + 1]
        prints[role] = bundle
    # the prefill role's own flags differ, so its fingerprint does; the connector part does not
    assert "--max-num-batched-tokens" in _engine_argv(objs["prefill-deployment.yaml"])
    assert "--max-num-batched-tokens" not in _engine_argv(objs["decode-deployment.yaml"])
    # another connector config is another fingerprint
    data = example()
    data["pd"]["kv_transfer_config"]["kv_buffer_device"] = "cuda"
    argv = _engine_argv(objects(data)["decode-deployment.yaml"])
    other = bundle_from(argv, "0.11.0", [{"id": "llama-3-8b-instruct"}])
    assert other.fingerprint != prints["decode"].fingerprint


def test_a_role_kv_role_reaches_only_that_role() -> None:
    data = example()
    data["pd"]["prefill"]["kv_role"] = "kv_producer"
    data["pd"]["decode"]["kv_role"] = "kv_consumer"
    objs = objects(data)
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        argv = _engine_argv(objs[f"{role}-deployment.yaml"])
        assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_role"] == kv_role


def test_side_channel_on_the_pod_ip_and_open_between_engine_pods_only() -> None:
    objs = objects(example())
    engine_labels = []
    for role in ("prefill", "decode"):
        deployment = objs[f"{role}-deployment.yaml"]
        container = _container(deployment)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["kv-side-channel"] == 5600
        env = {e["name"]: e for e in container["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5600"
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        engine_labels.append(deployment["spec"]["template"]["metadata"]["labels"])
    router_labels = objs["router-deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    policy = objs["engine-networkpolicy.yaml"]["spec"]
    for labels in engine_labels:
        assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    side = [r for r in policy["ingress"] if {"port": 5600, "protocol": "TCP"} in r["ports"]]
    assert len(side) == 1 and side[0]["ports"] == [{"port": 5600, "protocol": "TCP"}]
    peers = side[0]["from"][0]["podSelector"]["matchLabels"]
    assert all(peers.items() <= labels.items() for labels in engine_labels)
    assert not peers.items() <= router_labels.items()
    # the routers still reach only the gate and the supervisor
    router_rule = next(r for r in policy["ingress"] if r is not side[0])
    assert 5600 not in [p["port"] for p in router_rule["ports"]]


def test_router_discovers_both_roles_and_the_service_selects_them() -> None:
    objs = objects(example())
    args = _container(objs["router-deployment.yaml"])["command"]
    params = _parse(router_command, args[2:])
    selector = dict(pair.split("=", 1) for pair in params["selector"].split(","))
    for role in ("prefill", "decode"):
        labels = objs[f"{role}-deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
        assert labels["corral.dev/role"] == role
    router_labels = objs["router-deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= router_labels.items()
    assert objs["engine-service.yaml"]["spec"]["selector"] == selector


def test_explain_shows_each_roles_arithmetic(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["k8s", "render", "--config", str(EXAMPLE / "corral.yaml"), "--explain", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.stderr
    err = result.stderr
    assert "prefill maxSurge" in err and "min(spare 1 GPUs // 1 per engine, replicas 2)" in err
    assert "decode maxUnavailable" in err and "pd.decode.max_unavailable 1" in err
    assert "decode PDB maxUnavailable" in err
    assert "\n  maxSurge" not in err  # the fleet-wide total would be nobody's surge


def problems_of(data: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    return str(caught.value)


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        data = data.setdefault(key, {})
    data[last] = value


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("replicas", 4, ["replicas: 4:", "pd.prefill.replicas, pd.decode.replicas", "remove it"]),
        ("gpu.capacity", 5, ["gpu.capacity: 5:", "pd.prefill.gpu_capacity"]),
        ("pd.decode.replicas", 3, ["pd.decode.replicas: 3:", "more than pd.decode.gpu_capacity 2"]),
        ("pd.prefill.replicas", 0, ["pd.prefill.replicas: 0:", "greater than or equal to 1"]),
        (
            "pd.kv_transfer_config",
            {"kv_connector": "LMCacheConnectorV1"},
            ["'LMCacheConnectorV1'", "NixlConnector"],
        ),
        ("pd.prefill.kv_role", "kv_consumer", ["a prefill engine with kv_role kv_consumer cannot send KV"]),
        ("pd.decode.kv_role", "kv_producer", ["a decode engine with kv_role kv_producer cannot receive KV"]),
        ("pd.decode.args", ["--kv-transfer-config={}"], ["pd.decode.args", "set by the renderer"]),
        ("engine.args", ["--kv-transfer-config", "{}"], ["engine.args", "pd.kv_transfer_config"]),
        ("pd.side_channel_port", 8081, ["pd.side_channel_port: 8081:", "supervisor.port already uses"]),
        (
            "engine.env",
            {"VLLM_NIXL_SIDE_CHANNEL_HOST": "0.0.0.0"},
            ["engine.env.VLLM_NIXL_SIDE_CHANNEL_HOST"],
        ),
        ("engine.serving_group", "g", ["engine.serving_group: 'g':", "remove it"]),
        ("pd.both", {"replicas": 1}, ["pd.both", "not a config field", "prefill"]),
    ],
)
def test_bad_pd_config_names_the_field(path: str, value: Any, expected: list[str]) -> None:
    data = example()
    _set(data, path, value)
    message = problems_of(data)
    for text in expected:
        assert text in message, message


def test_a_missing_role_is_named() -> None:
    data = example()
    del data["pd"]["decode"]
    assert "pd.decode: (missing): required" in problems_of(data)


def test_an_aggregated_config_is_unchanged() -> None:
    seed = yaml.safe_load(
        (EXAMPLE.parent / "wait-for-kv-cache" / "corral.yaml").read_text(encoding="utf-8")
    )  # no pd section: one engine Deployment selected by role=engine, as before
    objs = objects(seed)
    assert "engine-deployment.yaml" in objs and "prefill-deployment.yaml" not in objs
    assert objs["engine-deployment.yaml"]["spec"]["selector"]["matchLabels"]["corral.dev/role"] == "engine"


def _running(template: dict[str, Any]) -> dict[str, Any]:
    """A pod of a rendered Deployment as the API server lists it once it is Ready."""
    return {
        "metadata": {
            "name": "pod-0",
            "namespace": "inference",
            "uid": "u0",
            "resourceVersion": "1",
            **template["metadata"],
        },
        "status": {
            "podIP": "10.0.0.5",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_the_routers_pod_source_reads_each_rendered_pods_role() -> None:
    objs = objects(example())
    for role in ("prefill", "decode"):
        pod = pod_view(_running(objs[f"{role}-deployment.yaml"]["spec"]["template"]))
        assert pod.role == role and pod.blocker() is None
    # an aggregated fleet's pods keep their selector label corral.dev/role=engine: both roles, routable
    seed = yaml.safe_load((EXAMPLE.parent / "wait-for-kv-cache" / "corral.yaml").read_text(encoding="utf-8"))
    pod = pod_view(_running(objects(seed)["engine-deployment.yaml"]["spec"]["template"]))
    assert pod.role == "both" and pod.blocker() is None
