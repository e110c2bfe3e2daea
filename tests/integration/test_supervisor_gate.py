"""The admission gate (`corral supervise --gate-port`): the dev endpoints of a VLLM_SERVER_DEV_MODE=1
engine are unreachable from the data port, inference is forwarded (streamed too) only while READY
and answered 503 with Retry-After while the engine sleeps; the engine is reachable on loopback only,
and a gate in front of a non-loopback engine URL is refused at start. Real processes."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request

from tests.integration.test_supervisor_support import http_json, supervised
from tests.support.procs import free_port

DEV = {"VLLM_SERVER_DEV_MODE": "1"}


def post(url: str, body: bytes = b"{}") -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_gate_hides_dev_endpoints_and_refuses_while_not_ready() -> None:
    gate_port = free_port()
    with supervised(
        sim_args=("--enable-sleep-mode",),
        sup_args=("--gate-port", str(gate_port), "--gate-host", "127.0.0.1", "--quiet-period", "0.3"),
        env=DEV,
    ) as sup:
        sup.wait_state("READY", 30)
        gate = f"http://127.0.0.1:{gate_port}"
        completion = b'{"model": "sim-model", "prompt": "hi", "max_tokens": 3}'
        status, _, body = post(gate + "/v1/completions", completion)
        assert status == 200 and b'"choices"' in body, body
        status, _, body = post(gate + "/v1/completions", completion[:-1] + b', "stream": true}')
        assert status == 200 and body.rstrip().endswith(b"data: [DONE]"), body
        for path in ("/sleep?level=1", "/wake_up", "/collective_rpc", "/release_kv_cache_memory", "/pause"):
            status, _, _ = post(gate + path)
            assert status == 404, path
        assert http_json(sup.engine_url + "/is_sleeping")[1] == {"is_sleeping": False}  # the sleep never ran

        status, op = http_json(sup.url + "/v1/sleep", "POST", {"level": 1})
        assert status == 202, op
        sup.wait_state("SLEEPING", 30)
        status, headers, body = post(gate + "/v1/completions", completion)
        assert status == 503 and int(headers["Retry-After"]) >= 1 and b"SLEEPING" in body, (status, body)
        counts = sup.state()["gate"]
        assert counts["refused_not_ready"] == 1 and counts["refused_path"] == 5 and counts["in_flight"] == {}
        assert http_json(sup.url + "/v1/wake", "POST", {})[0] == 202
        sup.wait_state("READY", 30)
        assert post(gate + "/v1/completions", completion)[0] == 200


def test_gate_needs_a_loopback_engine() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "corral",
            "supervise",
            "--gate-port",
            str(free_port()),
            "--engine-url",
            "http://10.0.0.5:8000",
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # the refusal is the contract: one line naming the value and what to do
    assert result.returncode == 2 and "loopback" in result.stderr, result


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_gate_lets_the_engines_metrics_be_read_and_nothing_else_of_the_dev_api() -> None:
    """The router's scored policies (prefix, load) scrape each engine's /metrics, and in a rendered pod
    the router reaches the engine only through the gate: a GET of /metrics passes, read-only; every
    other method on it, and every development endpoint (which the engine itself serves), stays 404."""
    gate_port = free_port()
    with supervised(
        sim_args=("--enable-sleep-mode",),
        sup_args=("--gate-port", str(gate_port), "--gate-host", "127.0.0.1"),
        env=DEV,
    ) as sup:
        sup.wait_state("READY", 30)
        gate = f"http://127.0.0.1:{gate_port}"
        status, body = get(gate + "/metrics")
        assert status == 200, body
        assert b"vllm:num_requests_running" in body and b"vllm:kv_cache_usage_perc" in body
        for method in ("POST", "PUT", "DELETE"):
            req = urllib.request.Request(gate + "/metrics", data=b"{}", method=method)
            try:
                urllib.request.urlopen(req, timeout=10)
                raise AssertionError(f"{method} /metrics passed the gate")
            except urllib.error.HTTPError as exc:
                assert exc.code == 404, (method, exc.code)
        dev_posts = (
            "/sleep?level=1",
            "/wake_up",
            "/collective_rpc",
            "/reset_prefix_cache",
            "/v1/load_lora_adapter",
            "/v1/unload_lora_adapter",
            "/abort_requests",
            "/metrics/../sleep",
            "/%6Detrics/../sleep",
        )
        for path in dev_posts:
            assert post(gate + path)[0] == 404, path
        assert get(gate + "/metrics/x")[0] == 404
        # the engine does serve them: only the gate keeps them from the data port
        for path in ("/is_sleeping", "/server_info", "/is_paused"):
            assert get(gate + path)[0] == 404, path
            assert get(sup.engine_url + path)[0] == 200, path
        assert post(sup.engine_url + "/reset_prefix_cache")[0] == 200
        assert http_json(sup.engine_url + "/is_sleeping")[1] == {"is_sleeping": False}  # no sleep ran
