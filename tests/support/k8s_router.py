"""A `corral router` that discovers its engines through the test's fake Kubernetes API server and
follows each pod's supervisor with tokens derived from a fleet key (per-pod tokens)."""

from __future__ import annotations

from pathlib import Path

from tests.support.procs import CorralProcess, free_port


def k8s_router(
    kubeconfig: Path,
    namespace: str,
    engine_port: int,
    supervisor_port: int,
    fleet_key: Path,
    *extra: str,
) -> tuple[CorralProcess, str]:
    """The router (pods selected by `app=vllm`, supervisor heartbeats every 0.5 s, `extra` flags after)
    and its URL, answering its /metrics."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    router = CorralProcess(
        ["router", "--port", str(port), "--router-id", "r1", "--discovery", "k8s",
         "--namespace", namespace, "--selector", "app=vllm", "--kubeconfig", str(kubeconfig),
         "--engine-port", str(engine_port), "--supervisor-port", str(supervisor_port),
         "--supervisor-token-key-file", str(fleet_key), "--supervisor-heartbeat", "0.5", *extra],
        env={"CORRAL_TOKEN": ""},
    )  # fmt: skip
    try:
        router.wait_http(url + "/metrics")
    except BaseException:
        router.stop()
        raise
    return router, url
