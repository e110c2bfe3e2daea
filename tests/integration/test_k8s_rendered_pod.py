"""The rendered engine pod's command lines, run as processes on loopback: the init container's
`corral supervise derive-token` (with the downward API's namespace and name), the supervisor
entrypoint with its admission gate (the vLLM command after `--` swapped for `corral sim` on the
host and port the rendering gives vLLM), the rendered router (Kubernetes discovery against the fake
API server, the fleet key instead of a token), the kubelet's probes and the preStop hook. The
engines enforce vLLM's API key (VLLM_API_KEY from a Secret, as the renderer recommends).

The pod's IP is 127.0.0.31. The rendering binds the engine to 127.0.0.1, so the pod IP must not
reach it; the gate and the supervisor (rendered on 0.0.0.0) are bound to the pod IP here. What is
checked: the engine answers only on loopback; the gate serves inference on the pod IP and refuses
the development endpoints; the router reaches the pod only through the gate, with the token it
derived itself and the engine's API key from its mounted Secret, for tenants only (their API keys file
from a Secret too); the probes answer, the router's from a client without any key, while its admin
routes want the admin key from its own Secret; the
preStop drain, with the init container's token, completes.

The rendered router listens on 0.0.0.0, where its admin routes answer only the admin key. Here it
listens on `127.1`: the resolver's 127.0.0.1, but to the router a name it cannot prove loopback-only,
so it applies the pod network's rule (it trusts a loopback peer only on a loopback-literal listener).
"""

from __future__ import annotations

import copy
import hashlib
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from corral.k8s.render.budgets import derive
from corral.k8s.render.config_reading import parse_config
from corral.k8s.render.manifests import render
from tests.integration.test_supervisor_support import http_json, short_tmp_dir
from tests.support.fake_kube import FakeKubeThread
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import http_status, wait_until
from tests.unit.test_k8s_render_manifests import variant

POD_IP = "127.0.0.31"
POD_NAME = "qwen-72b-engine-5d9c7-x2x4q"
ROUTER_HOST = "127.1"  # 127.0.0.1, but not a loopback literal: the router asks for the admin key


def rendered(engine_port: int, supervisor_port: int, gate_port: int) -> tuple[Any, dict[str, Any]]:
    data = copy.deepcopy(variant())
    data["engine"]["port"] = engine_port
    data["supervisor"] = {"port": supervisor_port, "gate_port": gate_port}
    data["engine"]["secret_env"]["VLLM_API_KEY"] = {"secret_name": "vllm-key", "key": "api-key"}
    # a router that sends the engines' key answers tenants only (render refuses it without their keys)
    data["router"]["tenant_keys"] = {"secret_name": "router-tenants", "key": "tenants.yaml"}
    data["drain"]["propagation_seconds"] = 3  # short: the drain at the end should not take minutes
    data["drain"]["quiet_period_seconds"] = 0.3
    config = parse_config(data)
    return config, {m.filename: m.obj for m in render(config, derive(config))}


def local(argv: list[str], paths: dict[str, str], env: dict[str, str]) -> list[str]:
    """The container's argv on this machine: `corral` is this interpreter's, the pod's paths are
    temporary ones, 0.0.0.0 is the pod IP, and $(VAR) is expanded as the kubelet does."""
    out = []
    for arg in argv:
        for var, value in env.items():
            arg = arg.replace(f"$({var})", value)
        for pod_path, here in paths.items():
            if arg == pod_path or arg.startswith(pod_path + "/"):
                arg = here + arg[len(pod_path) :]
        out.append(POD_IP if arg == "0.0.0.0" else arg)
    return out[1:] if out[0] == "corral" else out


def refused(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) != 0


def post_json(url: str, body: dict[str, Any], key: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=orjson.dumps(body), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_rendered_engine_pod_and_router_work_together_through_the_gate(tmp_path: Path) -> None:
    engine_port, supervisor_port, gate_port = free_port(), free_port(), free_port()
    config, objs = rendered(engine_port, supervisor_port, gate_port)
    template = objs["engine-deployment.yaml"]["spec"]["template"]
    init = template["spec"]["initContainers"][0]
    container = template["spec"]["containers"][0]
    router_container = objs["router-deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]

    key_dir, token_dir = tmp_path / "fleet-key", short_tmp_dir()
    admin_dir, engine_key_dir = tmp_path / "router-admin", tmp_path / "engine-api-key"
    tenants_dir = tmp_path / "router-tenants"
    for d in (key_dir, admin_dir, engine_key_dir, tenants_dir):
        d.mkdir()
    (key_dir / config.token.key).write_text(os.urandom(32).hex())
    admin_key, engine_key, tenant_key = os.urandom(32).hex(), os.urandom(32).hex(), os.urandom(32).hex()
    (admin_dir / config.router.admin_key.key).write_text(admin_key + "\n")  # as --from-literal=... leaves it
    (engine_key_dir / "api-key").write_text(engine_key)
    digest = hashlib.sha256(tenant_key.encode()).hexdigest()
    (tenants_dir / "tenants.yaml").write_text(f"- name: team-a\n  key_sha256: {digest}\n")
    paths = {
        "/etc/corral/fleet-key": str(key_dir),
        "/etc/corral/pod-token": str(token_dir),
        "/etc/corral/router-admin": str(admin_dir),
        "/etc/corral/engine-api-key": str(engine_key_dir),
        "/etc/corral/router-tenants": str(tenants_dir),
        "/var/lib/corral": str(short_tmp_dir() / "state"),
    }
    # the engine container's VLLM_API_KEY is the Secret key the router mounts
    engine_env = {e["name"]: e for e in container["env"]}
    assert engine_env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "vllm-key", "key": "api-key"}
    downward = {"POD_NAMESPACE": config.namespace, "POD_NAME": POD_NAME}

    # the init container
    derive_argv = local(init["command"], paths, downward)
    done = subprocess.run([sys.executable, "-m", "corral", *derive_argv], capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr

    # the supervisor entrypoint, with `corral sim` where vLLM would be
    argv = local(container["command"], paths, downward)
    engine = argv[argv.index("--") + 1 :]
    host, port = engine[engine.index("--host") + 1], engine[engine.index("--port") + 1]
    assert (host, port) == ("127.0.0.1", str(engine_port))
    sim = [sys.executable, "-m", "corral", "sim", "--host", host, "--port", port]
    sim += ["--model", config.model.served_name]
    # the kubelet puts the Secret's value in the container's env; the supervisor's probes send it too
    supervisor = CorralProcess(
        [*argv[: argv.index("--") + 1], *sim], env={"CORRAL_TOKEN": "", "VLLM_API_KEY": engine_key}
    )
    router: CorralProcess | None = None
    sup_url, gate_url = f"http://{POD_IP}:{supervisor_port}", f"http://{POD_IP}:{gate_port}"
    try:
        supervisor.wait_http(sup_url + "/readyz", timeout=60)  # the kubelet's readiness probe
        for probe in ("/startupz", "/livez"):
            assert http_status(sup_url + probe) == 200, probe
        # the engine is on loopback only; the pod network gets the gate, which keeps dev endpoints
        assert refused(POD_IP, engine_port)
        assert http_status(f"http://127.0.0.1:{engine_port}/health") == 200
        assert http_json(gate_url + "/v1/models", token=engine_key)[0] == 200
        assert http_json(gate_url + "/v1/models")[0] == 401  # the engine enforces its key
        status, _ = post_json(gate_url + "/collective_rpc", {"method": "x"})
        assert status == 404
        assert http_status(gate_url + "/metrics") == 200  # what the router's scored policies scrape
        # and the management API wants this pod's token
        assert http_json(sup_url + "/v1/state")[0] == 401
        token = (token_dir / "token").read_text().strip()
        assert http_json(sup_url + "/v1/state", token=token)[0] == 200

        with FakeKubeThread() as api:
            kubeconfig = api.kube.write_kubeconfig(tmp_path / "kubeconfig", config.namespace)
            labels = template["metadata"]["labels"]
            annotations = template["metadata"]["annotations"]

            def create(k: Any) -> int:
                k.create_pod(POD_NAME, POD_IP, config.namespace, labels, port=gate_port)
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
            router_argv[router_argv.index("--port") + 1] = str(router_port)
            router_argv[router_argv.index("--host") + 1] = ROUTER_HOST
            router = CorralProcess(
                [*router_argv, "--kubeconfig", str(kubeconfig), "--router-id", "r1"],
                env={"CORRAL_TOKEN": "", "VLLM_API_KEY": ""},
            )
            router_url = f"http://127.0.0.1:{router_port}"
            # the kubelet's probes: no key, and the router's answer is 200 all the same
            for probe in ("readinessProbe", "livenessProbe"):
                probe_path = router_container[probe]["httpGet"]["path"]
                router.wait_http(router_url + probe_path)
            # the admin routes: refused without the admin key, answered with it
            for path in ("/metrics", "/v1/fleet"):
                assert http_json(router_url + path)[0] == 401, path
                assert http_json(router_url + path, token=engine_key)[0] == 401, path
            with urllib.request.urlopen(
                urllib.request.Request(
                    router_url + "/metrics", headers={"Authorization": f"Bearer {admin_key}"}
                ),
                timeout=10,
            ) as resp:
                assert resp.status == 200 and b"# TYPE" in resp.read()

            def routable() -> list[dict[str, Any]]:
                fleet = http_json(router_url + "/v1/fleet", token=admin_key)[1]
                return [e for e in fleet["endpoints"] if e["routable"]]

            try:
                wait_until(lambda: len(routable()) == 1, 30, "the pod routable through its gate")
            except AssertionError:
                raise AssertionError(router.output()[-4000:]) from None
            endpoint = routable()[0]
            assert endpoint["url"] == gate_url
            assert endpoint["supervisor"]["stream"] == "connected"
            body = {"model": config.model.served_name, "prompt": "hello", "max_tokens": 4}
            # a client without a tenant's key is refused; a tenant is served, the router sending the
            # engine's own key from its mounted Secret (never the tenant's)
            assert post_json(router_url + "/v1/completions", body)[0] == 401
            assert post_json(router_url + "/v1/completions", body, engine_key)[0] == 401
            status, answer = post_json(router_url + "/v1/completions", body, tenant_key)
            assert status == 200, answer
            assert orjson.loads(answer)["choices"][0]["text"]
            admitted = http_json(sup_url + "/v1/state", token=token)[1]
            assert "r1" in admitted["routers"]["subscribed"]

            # the preStop hook, with the token the init container wrote
            prestop = local(container["lifecycle"]["preStop"]["exec"]["command"], paths, downward)
            # in the pod 127.0.0.1 reaches the supervisor on 0.0.0.0; here it listens on the pod IP
            assert prestop[prestop.index("--url") + 1] == f"http://127.0.0.1:{supervisor_port}"
            prestop[prestop.index("--url") + 1] = sup_url
            stopped = subprocess.run(
                [sys.executable, "-m", "corral", *prestop], capture_output=True, text=True, timeout=120
            )
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            try:
                wait_until(lambda: not routable(), 10, "the drained pod out of routing")
            except AssertionError:
                fleet = http_json(router_url + "/v1/fleet", token=admin_key)[1]
                raise AssertionError(f"{stopped.stdout}\n{fleet}\n{supervisor.output()[-3000:]}") from None
            acks = http_json(sup_url + "/v1/state", token=token)[1]["routers"]["acks"]
            assert "r1" in acks, acks
    finally:
        if router is not None:
            router.stop()
        supervisor.stop()
