"""The simulator's development and LoRA endpoints answer like real vLLM (CPU build) with
VLLM_SERVER_DEV_MODE=1 and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1: same status, same error JSON.

Only what the CPU build can do is compared (it has no sleep mode): validation errors, RPC body errors,
refusals before a pause, LoRA refusals, pause/resume/is_paused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import DEV_ENV
from tests.support.procs import CorralProcess, free_port

pytestmark = pytest.mark.e2e
JSON = {"content-type": "application/json"}

# (method, path, raw body, headers); the LoRA ones run without --enable-lora on both sides.
CASES: list[tuple[str, str, bytes | None, dict[str, str]]] = [
    ("GET", "/is_sleeping", None, {}),
    ("GET", "/is_paused", None, {}),
    ("POST", "/collective_rpc", b"{}", JSON),
    ("POST", "/collective_rpc", b"{nope", JSON),
    ("POST", "/sleep?level=5", None, {}),
    ("POST", "/sleep?level=x", None, {}),
    ("POST", "/sleep?mode=later", None, {}),
    ("POST", "/release_kv_cache_memory", None, {}),
    ("POST", "/abort_requests", b"[", JSON),
    ("POST", "/abort_requests", b"{}", JSON),
    ("POST", "/reset_prefix_cache", None, {}),
    ("POST", "/v1/unload_lora_adapter", b'{"lora_name": "ghost"}', JSON),
    ("POST", "/v1/unload_lora_adapter", b"x", {"content-type": "text/plain"}),
    ("POST", "/v1/load_lora_adapter", b'{"lora_path": "/x"}', JSON),
    ("POST", "/v1/load_lora_adapter", b'{"lora_name": "", "lora_path": ""}', JSON),
    ("POST", "/v1/load_lora_adapter", b'{"lora_name": "a", "lora_path": "/models/a"}', JSON),
]


@pytest.fixture(scope="module")
def real(vllm_engine: str) -> str:
    return vllm_engine  # the session's engine already runs with DEV_ENV


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    port = free_port()
    args = ["sim", "--port", str(port), "--model", "tiny", "--max-model-len", "256"]
    proc = CorralProcess(args, env=DEV_ENV)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    try:
        yield url
    finally:
        proc.stop()


def _call(url: str, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, Any]:
    r = httpx.request(method, url + path, content=body, headers=headers, timeout=30)
    return r.status_code, r.json()


@pytest.mark.parametrize(("method", "path", "body", "headers"), CASES)
def test_dev_and_lora_answers_match(
    real: str, sim: str, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> None:
    assert _call(sim, method, path, body, headers) == _call(real, method, path, body, headers)


def test_pause_resume_match(real: str, sim: str) -> None:
    for url in (real, sim):
        assert _call(url, "POST", "/pause", None, {}) == (200, {"status": "paused"})
        assert _call(url, "GET", "/is_paused", None, {}) == (200, {"is_paused": True})
        assert _call(url, "GET", "/is_sleeping", None, {}) == (200, {"is_sleeping": True})
        assert _call(url, "POST", "/resume", None, {}) == (200, {"status": "resumed"})
        assert _call(url, "GET", "/is_paused", None, {}) == (200, {"is_paused": False})
