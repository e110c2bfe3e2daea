"""A rendered engine pod that publishes KV events, and the rendered router reading them: the init
container, the supervisor entrypoint (vLLM swapped for `corral sim`, which publishes as vLLM does, with
the rendered `--kv-events-config`), the pod in the fake Kubernetes API server with the rendered
template's labels and annotations, and the router with the rendered flags (`--tokenizer sim`).

The pod's IP is 127.0.0.31. The router must subscribe there, where another pod's router would reach the
engine, not at 127.0.0.1 (its own host in a cluster): the pod annotation and the supervisor's state line
say the same wildcard address, and the router maps it to the pod IP. A prompt sent through the router
then shows up in the router's KV index, from the engine's own events."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from corral.engine.kv_events_address import KV_EVENTS_FLAG
from corral.k8s.render.budgets import derive
from corral.k8s.render.config_reading import parse_config
from corral.k8s.render.manifests import render
from corral.pod_labels import KV_EVENTS_ANNOTATION
from tests.integration.test_k8s_rendered_pod import POD_IP, POD_NAME, ROUTER_HOST, local
from tests.integration.test_supervisor_support import http_json, short_tmp_dir
from tests.support.fake_kube import FakeKubeThread
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until
from tests.unit.test_k8s_render_manifests import variant

SYSTEM = "You answer questions about the tides and the sea, briefly and with care. " * 10


def rendered(ports: dict[str, int]) -> tuple[Any, dict[str, Any]]:
    data = copy.deepcopy(variant())
    data["engine"]["port"] = ports["engine"]
    data["supervisor"] = {"port": ports["supervisor"], "gate_port": ports["gate"]}
    data["router"] = {**data["router"], "policy": "prefix", "tokenizer": "sim"}
    data["kv_events"] = {"port": ports["kv"], "replay_port": ports["replay"]}
    data["drain"]["propagation_seconds"] = 3
    data["drain"]["quiet_period_seconds"] = 0.3
    config = parse_config(data)
    return config, {m.filename: m.obj for m in render(config, derive(config))}


def test_the_rendered_router_follows_the_rendered_pods_kv_events_at_the_pod_ip(tmp_path: Path) -> None:
    ports = {n: free_port() for n in ("engine", "supervisor", "gate", "kv", "replay")}
    config, objs = rendered(ports)
    template = objs["engine-deployment.yaml"]["spec"]["template"]
    init, container = template["spec"]["initContainers"][0], template["spec"]["containers"][0]
    router_container = objs["router-deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    annotations = template["metadata"]["annotations"]
    assert annotations[KV_EVENTS_ANNOTATION] == f"tcp://*:{ports['kv']},tcp://*:{ports['replay']}"

    key_dir, token_dir, admin_dir = tmp_path / "fleet-key", short_tmp_dir(), tmp_path / "router-admin"
    for d in (key_dir, admin_dir):
        d.mkdir()
    (key_dir / config.token.key).write_text(os.urandom(32).hex())
    admin_key = os.urandom(32).hex()
    (admin_dir / config.router.admin_key.key).write_text(admin_key)
    paths = {
        "/etc/corral/fleet-key": str(key_dir),
        "/etc/corral/pod-token": str(token_dir),
        "/etc/corral/router-admin": str(admin_dir),
        "/var/lib/corral": str(short_tmp_dir() / "state"),
    }
    downward = {"POD_NAMESPACE": config.namespace, "POD_NAME": POD_NAME}
    derived = subprocess.run(
        [sys.executable, "-m", "corral", *local(init["command"], paths, downward)],
        capture_output=True,
        timeout=30,
    )
    assert derived.returncode == 0, derived.stderr

    argv = local(container["command"], paths, downward)
    engine = argv[argv.index("--") + 1 :]
    events = engine[engine.index(KV_EVENTS_FLAG) : engine.index(KV_EVENTS_FLAG) + 2]
    sim = [sys.executable, "-m", "corral", "sim", "--host", "127.0.0.1", "--port", str(ports["engine"])]
    sim += ["--model", config.model.served_name, "--seed", "0", "--ttft-base-ms", "2", "--itl-ms", "1"]
    supervisor = CorralProcess([*argv[: argv.index("--") + 1], *sim, *events], env={"CORRAL_TOKEN": ""})
    router: CorralProcess | None = None
    sup_url = f"http://{POD_IP}:{ports['supervisor']}"
    try:
        supervisor.wait_http(sup_url + "/readyz", timeout=60)
        token = (token_dir / "token").read_text().strip()
        state = http_json(sup_url + "/v1/state", token=token)[1]
        # the engine is on the pod's loopback: the supervisor keeps the wildcard for the router to map
        assert state["kv_events"] == annotations[KV_EVENTS_ANNOTATION], state["kv_events"]

        with FakeKubeThread() as api:
            kubeconfig = api.kube.write_kubeconfig(tmp_path / "kubeconfig", config.namespace)

            def create(k: Any) -> int:
                k.create_pod(
                    POD_NAME, POD_IP, config.namespace, template["metadata"]["labels"], port=ports["gate"]
                )
                return int(
                    k.update_pod(
                        POD_NAME,
                        lambda pod: pod["metadata"].__setitem__("annotations", dict(annotations)),
                        config.namespace,
                    )
                )

            api.call(create)
            router_port = free_port()
            router_argv = local(router_container["command"], paths, downward)
            assert router_argv[router_argv.index("--tokenizer") + 1] == "sim"
            router_argv[router_argv.index("--port") + 1] = str(router_port)
            router_argv[router_argv.index("--host") + 1] = ROUTER_HOST
            router = CorralProcess(
                [*router_argv, "--kubeconfig", str(kubeconfig), "--router-id", "r1"], env={"CORRAL_TOKEN": ""}
            )
            router_url = f"http://127.0.0.1:{router_port}"
            router.wait_http(router_url + "/livez")

            def endpoint() -> dict[str, Any]:
                fleet = http_json(router_url + "/v1/fleet", token=admin_key)[1]
                routable = [e for e in fleet["endpoints"] if e["routable"]]
                return routable[0] if routable else {}

            try:
                wait_until(lambda: bool(endpoint()), 30, "the pod routable through its gate")
            except AssertionError:
                raise AssertionError(router.output()[-4000:]) from None
            body = {
                "model": config.model.served_name,
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "What makes a spring tide?"},
                ],
                "max_tokens": 2,
            }
            req = urllib.request.Request(
                router_url + "/v1/chat/completions",
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 200

            def indexed() -> int:
                feed = endpoint().get("kv_events") or {}
                return int((feed.get("index") or {}).get("blocks", 0))

            try:
                wait_until(lambda: indexed() > 0, 20, "the request's blocks in the router's KV index")
            except AssertionError as exc:
                seen = json.dumps(endpoint()["kv_events"])
                raise AssertionError(f"{exc}: {seen}{router.output()[-3000:]}") from None
            feed = endpoint()["kv_events"]
            # subscribed at the pod IP, where a router in another pod reaches the engine
            assert feed["endpoint"] == f"tcp://{POD_IP}:{ports['kv']}", feed
    finally:
        if router is not None:
            router.stop()
        supervisor.stop()
