"""`corral k8s render` turns the engines' KV-cache events on where the config allows it, and says why
for each engine group: the engine's `--kv-events-config` on named ports, the pod annotation the router's
pod source reads (the same text the engine's supervisor publishes), a NetworkPolicy that opens those
ports to the router pods only, and the router's `--tokenizer`. Off by config, with prefix caching
disabled, with data-parallel ranks, under a policy that does not place by prefix, without a tokenizer or
without the NetworkPolicy, each with its reason; a P/D fleet decides per role; bad values are refused
naming the field, the value and what to do."""

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
from corral.engine.kv_events import parse_kv_events_config
from corral.engine.kv_events_address import KV_EVENTS_FLAG, address_from_argv, parse_address
from corral.k8s.render.budgets import derive
from corral.k8s.render.config_reading import ConfigError, parse_config
from corral.k8s.render.manifests import render
from corral.pod_labels import KV_EVENTS_ANNOTATION
from corral.router.cli import router as router_command
from corral.router.discovery.k8s_pods import pod_view
from tests.unit.test_k8s_render_manifests import KUBERNETES, variant
from tests.unit.test_k8s_render_pd import example as pd_example

REASON = "corral.dev/kv-events-reason"
ROUTER_IMAGE = "registry.example.com/corral-router-tokenizers:1"
TOKENIZER = "Qwen/Qwen2.5-72B-Instruct"
POD_IP = "10.0.0.9"


def publishing(data: dict[str, Any] | None = None) -> dict[str, Any]:
    """A config under which the engines publish: a prefix policy and a router that can tokenize."""
    data = copy.deepcopy(data if data is not None else variant())
    data["router"] = {
        **data.get("router", {}),
        "policy": "prefix",
        "image": ROUTER_IMAGE,
        "tokenizer": TOKENIZER,
    }
    return data


def objects(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    config = parse_config(copy.deepcopy(data))
    return {m.filename: m.obj for m in render(config, derive(config))}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return found


def engine_argv(deployment: dict[str, Any]) -> list[str]:
    command: list[str] = container(deployment)["command"]
    return command[command.index("--") + 1 :]


def router_argv(objs: dict[str, dict[str, Any]]) -> list[str]:
    command: list[str] = container(objs["router-deployment.yaml"])["command"]
    return command


def router_ingress_ports(objs: dict[str, dict[str, Any]]) -> set[int]:
    [rule] = [
        r
        for r in objs["engine-networkpolicy.yaml"]["spec"]["ingress"]
        if r["from"][0].get("podSelector", {}).get("matchLabels", {}).get("corral.dev/role") == "router"
    ]
    return {p["port"] for p in rule["ports"]}


def other_ingress_ports(objs: dict[str, dict[str, Any]]) -> set[int]:
    rules = objs["engine-networkpolicy.yaml"]["spec"]["ingress"]
    return {
        p["port"]
        for r in rules
        if r["from"][0].get("podSelector", {}).get("matchLabels", {}).get("corral.dev/role") != "router"
        for p in r["ports"]
    }


def reason(deployment: dict[str, Any]) -> str:
    text: str = deployment["metadata"]["annotations"][REASON]
    return text


def pod_body(deployment: dict[str, Any]) -> dict[str, Any]:
    """A pod as the API server would list it from this Deployment's template."""
    meta = deployment["spec"]["template"]["metadata"]
    return {
        "metadata": {"namespace": "inference", "name": "p", "uid": "u", **copy.deepcopy(meta)},
        "status": {"podIP": POD_IP, "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _parse(command: click.Command, args: list[str]) -> dict[str, Any]:
    with click.Context(command) as parent:
        ctx = command.make_context(command.name, list(args), parent=parent)
    return dict(ctx.params)


def test_on_the_engine_publishes_on_named_ports_and_the_router_reads_it_with_its_tokenizer() -> None:
    objs = objects(publishing())
    deployment = objs["engine-deployment.yaml"]
    argv = engine_argv(deployment)
    assert argv.count(KV_EVENTS_FLAG) == 1
    events = parse_kv_events_config(argv[argv.index(KV_EVENTS_FLAG) + 1])
    assert events.publishing
    assert (events.endpoint, events.replay_endpoint) == ("tcp://*:5557", "tcp://*:5558")
    ports = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
    assert ports["kv-events"] == 5557 and ports["kv-replay"] == 5558
    # the router's pod source reads the annotation render wrote, the wildcard meaning the pod IP
    annotation = pod_view(pod_body(deployment)).kv_events
    assert annotation == "tcp://*:5557,tcp://*:5558"
    where = parse_address(annotation, POD_IP)
    assert (where.endpoint, where.replay) == (f"tcp://{POD_IP}:5557", f"tcp://{POD_IP}:5558")
    # and the pod's supervisor (engine on loopback) publishes the same text on its state stream
    supervisor = container(deployment)["command"]
    engine_url = supervisor[supervisor.index("--engine-url") + 1]
    published = address_from_argv(argv, engine_url)
    assert published is not None and published.to_text() == annotation
    assert reason(deployment).startswith("on: ")
    # the events carry prompt tokens: the routers alone may reach the ports
    assert {5557, 5558} <= router_ingress_ports(objs)
    router = router_argv(objs)
    assert router[router.index("--tokenizer") + 1] == TOKENIZER
    assert _parse(router_command, router[2:])["tokenizer"] == TOKENIZER
    env = {e["name"]: e["value"] for e in container(objs["router-deployment.yaml"])["env"]}
    assert env["HF_HOME"].startswith("/tmp/")  # a hub id downloads under the writable /tmp
    for obj in objs.values():
        kubernetes_validate.validate(yaml.safe_load(yaml.safe_dump(obj)), KUBERNETES, strict=True)


def test_peers_besides_the_routers_never_get_the_event_ports() -> None:
    data = publishing()
    data["network_policy"] = {"supervisor_from": [{"namespace_labels": {"name": "monitoring"}}]}
    data["monitoring"] = {"service_monitors": True}
    objs = objects(data)
    assert {5557, 5558} <= router_ingress_ports(objs)
    assert not {5557, 5558} & other_ingress_ports(objs)


def assert_off(objs: dict[str, dict[str, Any]], why: str, deployment: str = "engine-deployment.yaml") -> None:
    engine = objs[deployment]
    assert KV_EVENTS_FLAG not in engine_argv(engine)
    assert not {"kv-events", "kv-replay"} & {p["name"] for p in container(engine)["ports"]}
    assert KV_EVENTS_ANNOTATION not in engine["spec"]["template"]["metadata"]["annotations"]
    assert reason(engine).startswith("off: ") and why in reason(engine), reason(engine)


def test_off_by_config() -> None:
    data = publishing()
    data["kv_events"] = {"enabled": False}
    objs = objects(data)
    assert_off(objs, "kv_events.enabled is false")
    assert "--tokenizer" not in router_argv(objs)
    assert not {5557, 5558} & router_ingress_ports(objs)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--no-enable-prefix-caching"], "prefix caching is disabled"),
        (["--data-parallel-size", "2"], "--data-parallel-size 2"),
        (["-dp=4"], "--data-parallel-size 4"),
    ],
)
def test_off_where_the_engine_cannot_say_what_a_pod_holds(args: list[str], why: str) -> None:
    data = publishing()
    data["engine"]["args"] = [*data["engine"]["args"], *args]
    objs = objects(data)
    assert_off(objs, why)
    assert "--tokenizer" not in router_argv(objs)


def test_prefix_caching_turned_back_on_publishes() -> None:
    data = publishing()
    data["engine"]["args"] += ["--no-enable-prefix-caching", "--enable-prefix-caching"]
    assert reason(objects(data)["engine-deployment.yaml"]).startswith("on: ")


def test_off_under_a_policy_that_does_not_place_by_prefix() -> None:
    data = publishing()
    data["router"]["policy"] = "least_request"
    assert_off(objects(data), "router.policy least_request does not place requests by prefix")


def test_off_without_a_tokenizer_for_the_router() -> None:
    data = publishing()
    del data["router"]["tokenizer"]
    objs = objects(data)
    assert_off(objs, "router.tokenizer is not set")
    assert "--tokenizer" not in router_argv(objs)


def test_off_without_the_network_policy() -> None:
    data = publishing()
    data["network_policy"] = {"enabled": False}
    assert_off(objects(data), "network_policy.enabled is false")


def test_the_sim_tokenizer_needs_no_transformers_and_no_cache() -> None:
    data = publishing()
    del data["router"]["image"]  # the Corral router image: no transformers, but sim needs none
    data["router"]["tokenizer"] = "sim"
    objs = objects(data)
    assert reason(objs["engine-deployment.yaml"]).startswith("on: ")
    router = router_argv(objs)
    assert router[router.index("--tokenizer") + 1] == "sim"
    assert "env" not in container(objs["router-deployment.yaml"])


def test_pd_decides_per_role() -> None:
    # under least_request the prefill legs are not placed by prefix; decode legs always go by `load`
    data = pd_example()
    data["router"] = {**data["router"], "image": ROUTER_IMAGE, "tokenizer": "/tokenizers/llama"}
    objs = objects(data)
    assert_off(objs, "router.policy least_request", "prefill-deployment.yaml")
    decode = objs["decode-deployment.yaml"]
    assert reason(decode).startswith("on: ") and "decode legs" in reason(decode)
    assert pod_view(pod_body(decode)).kv_events == "tcp://*:5557,tcp://*:5558"
    assert {5557, 5558} <= router_ingress_ports(objs)
    assert "--tokenizer" in router_argv(objs)
    data["router"]["policy"] = "prefix"
    objs = objects(data)
    for role in ("prefill", "decode"):
        deployment = objs[f"{role}-deployment.yaml"]
        assert reason(deployment).startswith("on: "), role
        argv = engine_argv(deployment)
        assert argv.count(KV_EVENTS_FLAG) == 1 and "--kv-transfer-config" in argv
    for obj in objs.values():
        kubernetes_validate.validate(yaml.safe_load(yaml.safe_dump(obj)), KUBERNETES, strict=True)


def test_a_pd_role_with_its_own_data_parallel_ranks_is_off_alone() -> None:
    data = pd_example()
    data["router"] = {**data["router"], "image": ROUTER_IMAGE, "tokenizer": "/t", "policy": "prefix"}
    data["pd"]["decode"]["args"] = ["--data-parallel-size", "2"]
    objs = objects(data)
    assert reason(objs["prefill-deployment.yaml"]).startswith("on: ")
    assert_off(objs, "--data-parallel-size 2", "decode-deployment.yaml")


def problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    return [str(p) for p in caught.value.problems]


def test_the_flag_is_the_renderers_while_events_are_enabled() -> None:
    data = publishing()
    data["engine"]["args"] += ["--kv-events-config", '{"enable_kv_cache_events": true}']
    [problem] = problems(data)
    assert problem.startswith("engine.args: '--kv-events-config'")
    assert "remove it, or set kv_events.enabled: false" in problem
    data["kv_events"] = {"enabled": False}  # then the engine runs its own
    argv = engine_argv(objects(data)["engine-deployment.yaml"])
    assert argv.count(KV_EVENTS_FLAG) == 1


def test_ports_that_collide_are_refused() -> None:
    data = publishing()
    data["kv_events"] = {"port": 8080, "replay_port": 8080}  # the gate's port, twice
    found = problems(data)
    gate = "kv_events.port: 8080: supervisor.gate_port already uses this port; pick another (e.g. 5557)"
    assert gate in found
    assert any(p.startswith("kv_events.replay_port: 8080: kv_events.port already uses") for p in found)


@pytest.mark.parametrize(
    ("section", "needle"),
    [
        ({"port": 0}, "kv_events.port: 0:"),
        ({"enabled": "sometimes"}, "kv_events.enabled: 'sometimes':"),
        ({"ports": 1}, "kv_events.ports"),
    ],
)
def test_bad_values_name_the_field_and_value(section: dict[str, Any], needle: str) -> None:
    data = publishing()
    data["kv_events"] = section
    assert any(needle in p for p in problems(data)), problems(data)


def test_a_model_tokenizer_in_the_corral_router_image_is_refused() -> None:
    data = publishing()
    del data["router"]["image"]
    [problem] = problems(data)
    assert problem.startswith(f"router.tokenizer: '{TOKENIZER}': ")
    assert "`transformers`" in problem and "router.image" in problem


def test_render_prints_one_line_per_group(tmp_path: Path) -> None:
    data = pd_example()
    data["router"] = {**data["router"], "image": ROUTER_IMAGE, "tokenizer": "/t"}
    path = tmp_path / "corral.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = CliRunner().invoke(main, ["k8s", "render", "--config", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "KV events" in line]
    assert len(lines) == 2, lines
    assert lines[0].startswith("corral k8s render: KV events for prefill: off: router.policy least_request")
    assert lines[1].startswith("corral k8s render: KV events for decode: on: ")


def test_prefix_routing_replicas_without_events_are_warned_of(tmp_path: Path) -> None:
    """Router replicas that place by prefix without KV events place each prefix apart (issue 28): render
    says so, and says nothing once the events are on or one replica routes."""
    blind = publishing()
    blind["router"] = {**blind["router"], "replicas": 2}
    del blind["router"]["tokenizer"]
    for data, warned in ((blind, True), ({**blind, "router": {**blind["router"], "replicas": 1}}, False)):
        path = tmp_path / "corral.yaml"
        path.write_text(yaml.safe_dump(data))
        result = CliRunner().invoke(
            main, ["k8s", "render", "--config", str(path), "--out", str(tmp_path / "o")]
        )
        assert result.exit_code == 0, result.stderr
        lines = [line for line in result.stderr.splitlines() if "without KV events" in line]
        assert len(lines) == int(warned), result.stderr
        if warned:
            assert lines[0].startswith(
                "corral k8s render: warning: router.replicas 2 place prompts by prefix"
            )
    seeing = publishing()
    seeing["router"] = {**seeing["router"], "replicas": 3}
    path = tmp_path / "corral.yaml"
    path.write_text(yaml.safe_dump(seeing))
    result = CliRunner().invoke(main, ["k8s", "render", "--config", str(path), "--out", str(tmp_path / "o2")])
    # the printed answer is the contract: what the person who ran the command reads
    assert result.exit_code == 0 and "without KV events" not in result.stderr, result.stderr
