"""Per-pod supervisor tokens with real processes on loopback: two supervised `corral sim` pods (each
on its own 127.0.0.N, listed by the fake Kubernetes API server), each supervisor holding only its own
token, made by `corral supervise derive-token` from the fleet key and the pod's namespace/name as
the rendered init container makes it. Pod A's token is refused by pod B's supervisor; a router given
the fleet key (`--supervisor-token-key-file`) derives each pod's token itself, follows both state
streams and acknowledges to both supervisors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_supervisor_support import http_json, short_tmp_dir
from tests.support.fake_kube import FakeKubeThread
from tests.support.k8s_router import k8s_router
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until

NS = "tokens"
LABELS = {"app": "vllm"}
PODS = {"vllm-a": "127.0.0.21", "vllm-b": "127.0.0.22"}


def derive(key_file: Path, pod: str, out: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "corral", "supervise", "derive-token", "--key-file", str(key_file),
         "--namespace", NS, "--pod-name", pod, "--out", str(out)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert oct(out.stat().st_mode & 0o777) == oct(0o600)
    return out.read_text().strip()


@pytest.fixture
def fleet_key(tmp_path: Path) -> Path:
    path = tmp_path / "fleet-key"
    path.write_text(os.urandom(32).hex() + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def procs() -> Iterator[list[CorralProcess]]:
    started: list[CorralProcess] = []
    yield started
    for proc in reversed(started):
        proc.stop(grace=5)


def state_of(url: str, token: str) -> tuple[int, Any]:
    return http_json(url + "/v1/state", token=token)


def test_a_pods_token_opens_only_its_own_supervisor_and_the_router_derives_each(
    tmp_path: Path, fleet_key: Path, procs: list[CorralProcess]
) -> None:
    engine_port, supervisor_port = free_port(), free_port()
    tokens = {pod: derive(fleet_key, pod, tmp_path / f"{pod}.token") for pod in PODS}
    assert len(set(tokens.values())) == len(PODS)
    sup_urls = {pod: f"http://{ip}:{supervisor_port}" for pod, ip in PODS.items()}
    with FakeKubeThread() as api:
        kubeconfig = api.kube.write_kubeconfig(tmp_path / "kubeconfig", NS)
        router, router_url = k8s_router(kubeconfig, NS, engine_port, supervisor_port, fleet_key)
        procs.append(router)
        # the engines wait for this file: until then each supervisor says STARTING, which the router
        # acknowledges with that pod's token
        go = tmp_path / "go"
        for pod, ip in PODS.items():
            state_dir = short_tmp_dir() / "state"
            argv = [
                "supervise", "--host", ip, "--port", str(supervisor_port),
                "--engine-url", f"http://{ip}:{engine_port}", "--state-dir", str(state_dir),
                "--token-file", str(tmp_path / f"{pod}.token"), "--quiet-period", "0.2",
                "--wait-for", f"file:{go}", "--",
                sys.executable, "-m", "corral", "sim", "--host", ip, "--port", str(engine_port),
                "--model", "sim-model",
            ]  # fmt: skip
            procs.append(CorralProcess(argv, env={"CORRAL_TOKEN": ""}))
            api.call(lambda k, pod=pod, ip=ip: k.create_pod(pod, ip, NS, LABELS, port=engine_port))
        for pod, proc in zip(PODS, procs[1:], strict=True):
            proc.wait_http(sup_urls[pod] + "/livez")

        # each token opens its own supervisor and no other
        for pod, url in sup_urls.items():
            assert state_of(url, tokens[pod])[0] == 200
            other = next(p for p in PODS if p != pod)
            status, body = state_of(url, tokens[other])
            assert status == 401, (pod, status, body)
            assert tokens[other] not in str(body)

        # the router derived both tokens: both streams up and acknowledged, then both endpoints routable
        def endpoints() -> dict[str, Any]:
            fleet = http_json(router_url + "/v1/fleet")[1]
            return {e["name"]: e for e in fleet["endpoints"]}

        def acknowledged() -> bool:
            views = [e["supervisor"] for e in endpoints().values() if e["supervisor"]]
            return len(views) == len(PODS) and all(v["acked_epoch"] is not None for v in views)

        try:
            wait_until(acknowledged, 30, "both supervisors' first state acknowledged")
        except AssertionError:
            raise AssertionError(router.output()[-4000:]) from None
        for pod, url in sup_urls.items():
            routers = state_of(url, tokens[pod])[1]["routers"]
            assert "r1" in routers["subscribed"], (pod, routers)
            assert "r1" in routers["acks"], (pod, routers)
        go.touch()

        def routable() -> dict[str, Any]:
            fleet = http_json(router_url + "/v1/fleet")[1]
            return {e["name"]: e for e in fleet["endpoints"] if e["routable"]}

        try:
            wait_until(lambda: len(routable()) == len(PODS), 60, "both pods routable")
        except AssertionError:
            raise AssertionError(router.output()[-4000:]) from None
        for endpoint in routable().values():
            assert (
                endpoint["supervisor"]["stream"] == "connected" and endpoint["supervisor"]["state"] == "READY"
            )
        # a refused token shows as a 401 in the stream's log line; ",401" is a timestamp's milliseconds
        assert not re.search(r"(?<![,\d])401\b", router.output()), router.output()[-4000:]
