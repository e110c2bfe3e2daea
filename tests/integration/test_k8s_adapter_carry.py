"""Kubernetes: a pod that joins later gets the LoRA adapters loaded at run time on the fleet, not only
its `--lora` set. Two supervised LoRA `corral sim` pods listed by the fake Kubernetes API server, each
supervisor holding only its own token (as rendered), a router with the fleet key and
`--carry-adapters-seconds`: an adapter loaded at run time on pod A (`POST /v1/lora/load`) is loaded on
pod B, which joins after it, through B's supervisor, before the router routes B at all; B's
supervisor then keeps it in its runtime set, and the router routes the adapter to B."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_supervisor_support import http_json, short_tmp_dir
from tests.integration.test_supervisor_tokens_per_pod import derive
from tests.support.fake_kube import FakeKubeThread
from tests.support.k8s_router import k8s_router
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until

NS = "tokens"  # derive() makes tokens for this namespace
LABELS = {"app": "vllm"}
PODS = {"vllm-a": "127.0.0.31", "vllm-b": "127.0.0.32"}
ENV = {"CORRAL_TOKEN": "", "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
ADAPTER = "adapter-rt"


@pytest.fixture
def procs() -> Iterator[list[CorralProcess]]:
    started: list[CorralProcess] = []
    yield started
    for proc in reversed(started):
        proc.stop(grace=5)


def run_load(url: str, token: str, path: Path) -> dict[str, Any]:
    status, op = http_json(url + "/v1/lora/load", "POST", {"name": ADAPTER, "path": str(path)}, token=token)
    assert status == 202, op
    done: dict[str, Any] = {}

    def finished() -> bool:
        body = http_json(f"{url}/v1/operations/{op['operation_id']}", token=token)[1]
        done.update(body)
        return body["status"] != "running"

    wait_until(finished, 60, "the load finished")
    return done


def test_a_pod_that_joins_later_gets_the_runtime_adapters_before_it_is_routed(
    tmp_path: Path, procs: list[CorralProcess]
) -> None:
    key = tmp_path / "fleet-key"
    key.write_text(os.urandom(32).hex() + "\n")
    key.chmod(0o600)
    adapter = tmp_path / ADAPTER
    adapter.mkdir()
    engine_port, supervisor_port = free_port(), free_port()
    tokens = {pod: derive(key, pod, tmp_path / f"{pod}.token") for pod in PODS}
    sups = {pod: f"http://{ip}:{supervisor_port}" for pod, ip in PODS.items()}
    with FakeKubeThread() as api:
        kubeconfig = api.kube.write_kubeconfig(tmp_path / "kubeconfig", NS)
        router, router_url = k8s_router(
            kubeconfig, NS, engine_port, supervisor_port, key,
            "--carry-adapters-seconds", "120", "--models-refresh-seconds", "0.5",
        )  # fmt: skip
        procs.append(router)

        def start_pod(pod: str) -> None:
            ip = PODS[pod]
            argv = [
                "supervise", "--host", ip, "--port", str(supervisor_port),
                "--engine-url", f"http://{ip}:{engine_port}", "--state-dir", str(short_tmp_dir() / "state"),
                "--token-file", str(tmp_path / f"{pod}.token"), "--quiet-period", "0.2", "--",
                sys.executable, "-m", "corral", "sim", "--host", ip, "--port", str(engine_port),
                "--model", "sim-model", "--enable-lora", "--max-loras", "2",
            ]  # fmt: skip
            procs.append(CorralProcess(argv, env=ENV))
            api.call(lambda k: k.create_pod(pod, ip, NS, LABELS, port=engine_port))

        def endpoints() -> dict[str, Any]:
            fleet = http_json(router_url + "/v1/fleet")[1]
            return {e["name"].split("/")[-1]: e for e in fleet["endpoints"]}

        def routable(pod: str) -> bool:
            endpoint = endpoints().get(pod)
            return endpoint is not None and endpoint["routable"]

        start_pod("vllm-a")
        try:
            wait_until(lambda: routable("vllm-a"), 60, "pod A routable")
        except AssertionError:
            raise AssertionError(router.output()[-4000:]) from None
        loaded = run_load(sups["vllm-a"], tokens["vllm-a"], adapter)
        assert loaded["status"] == "succeeded", loaded

        start_pod("vllm-b")
        seen: list[dict[str, Any]] = []

        def b_routable() -> bool:
            endpoint = endpoints().get("vllm-b")
            if endpoint is None:
                return False
            seen.append(endpoint)
            if not endpoint["routable"]:
                return False
            # routed only once its supervisor desires and serves the fleet's runtime adapter
            state = http_json(sups["vllm-b"] + "/v1/state", token=tokens["vllm-b"])[1]
            assert ADAPTER in state["adapters"]["served"], (endpoint, state["adapters"])
            return True

        try:
            wait_until(b_routable, 90, "pod B routable")
        except AssertionError:
            raise AssertionError(router.output()[-4000:]) from None
        # held from the moment the router saw it (then until the carry was done: b_routable)
        assert seen[0]["held"] is not None and seen[0]["held"].startswith("joining"), seen[0]
        state = http_json(sups["vllm-b"] + "/v1/state", token=tokens["vllm-b"])[1]
        assert state["adapters"]["desired"] == {ADAPTER: str(adapter)}, state["adapters"]
        assert state["adapters"]["runtime"] == [ADAPTER], state["adapters"]  # outlives B's restarts
        fleet = http_json(router_url + "/v1/fleet")[1]
        b_url = endpoints()["vllm-b"]["url"]
        assert fleet["adapter_carry"]["carried"][b_url] == {ADAPTER: str(adapter)}, fleet["adapter_carry"]
        assert fleet["adapter_carry"]["carried"][endpoints()["vllm-a"]["url"]] == {}

        # the router routes the adapter to both pods now: pod A's runtime load is read by the k8s
        # source's /v1/models refresh (--models-refresh-seconds), as pod B's carried one
        def adapter_on_both() -> bool:
            return all(ADAPTER in e["models"] and e["routable"] for e in endpoints().values())

        try:
            wait_until(adapter_on_both, 30, "the adapter routable on both pods")
        except AssertionError:
            seen_now = {n: (e["models"], e["routable"], e["why"]) for n, e in endpoints().items()}
            raise AssertionError(seen_now) from None
        status, answer = http_json(
            router_url + "/v1/completions", "POST", {"model": ADAPTER, "prompt": "hi", "max_tokens": 2}
        )
        assert status == 200 and answer["model"] == ADAPTER, answer
