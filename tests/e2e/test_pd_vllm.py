"""Prefill/decode disaggregation through `corral router --prefill A --decode B` with two real vLLM CPU engines
and vLLM's ExampleConnector, a storage connector: the prefill engine (kv_producer) saves each prompt's KV
under a shared directory, the decode engine (kv_consumer) loads it from there by the prompt's tokens. The
prefill answer carries no `kv_transfer_params`, so the router's decode leg is the client's body as it came
(router/datapath/pd.py, the storage hand-off).

The reference answer is the same request sent straight to the prefill engine afterwards: that engine
computed the prompt itself in the prefill leg (the store was empty), so its answer is the computed one
that the decode engine's loaded KV must reproduce (temperature 0).
"""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from corral.engine.metrics_text import samples
from tests.e2e.conftest import SERVED_NAME, start_engine, stop_engine, vllm_command
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import http_status, wait_http_200, wait_until

pytestmark = pytest.mark.e2e

# Two engines start side by side: about 60-80 s each in CI, minutes on a loaded 2-core machine.
ENGINE_START_S = 600
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
GENERATED = "vllm:generation_tokens_total"
PROMPT_LEN = 200  # token ids: ExampleConnector stores whole blocks only (the CPU build's are 128 tokens)


@dataclass
class PdPair:
    prefill: str
    decode: str
    router: str
    storage: Path


def connector_config(role: str, storage: Path) -> str:
    return json.dumps(
        {
            "kv_connector": "ExampleConnector",
            "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(storage)},
        }
    )


@pytest.fixture(scope="module")
def pd_pair(vllm_python: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PdPair]:
    """A kv_producer and a kv_consumer engine on one storage directory, started together, and a router."""
    work = tmp_path_factory.mktemp("pd")
    storage = work / "kv"
    storage.mkdir()
    engines: list[tuple[subprocess.Popen[bytes], Path, str]] = []
    router: CorralProcess | None = None
    try:
        for role in ("kv_producer", "kv_consumer"):
            port = free_port()
            extra = ("--kv-transfer-config", connector_config(role, storage))
            log_path = work / f"{role}.log"
            proc = start_engine(vllm_command(vllm_python, tiny_model, port, *extra), log_path)
            engines.append((proc, log_path, f"http://127.0.0.1:{port}"))
        waits = [
            threading.Thread(target=wait_started, args=(proc, url), daemon=True) for proc, _, url in engines
        ]
        for t in waits:
            t.start()
        for t in waits:
            t.join(ENGINE_START_S + 10)
        for proc, log_path, url in engines:
            if proc.poll() is not None or http_status(url + "/health") != 200:
                pytest.fail(f"vLLM engine {url} did not start within {ENGINE_START_S}s; its log: {log_path}")
        prefill, decode = engines[0][2], engines[1][2]
        port = free_port()
        router = CorralProcess(
            ["router", "--host", "127.0.0.1", "--port", str(port), "--prefill", prefill, "--decode", decode,
             "--models-refresh-seconds", "0.5"]
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        router.wait_http(url + "/health", timeout=30)
        wait_until(lambda: routable(url) == 2, 60, "the router to route both engines")
        yield PdPair(prefill, decode, url, storage)
    finally:
        if router is not None:
            router.stop()
        for proc, log_path, _ in engines:
            stop_engine(proc, log_path)


def wait_started(proc: subprocess.Popen[bytes], url: str) -> None:
    try:
        wait_http_200(url + "/health", timeout=ENGINE_START_S, alive=lambda: proc.poll() is None)
    except AssertionError:
        pass  # the fixture's own check says which engine failed


def routable(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/v1/fleet", timeout=2) as resp:
            return sum(bool(e["routable"]) for e in orjson.loads(resp.read())["endpoints"])
    except OSError:
        return 0


def post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url + "/v1/completions", data=orjson.dumps(body), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        return resp.status, resp.read()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
        return text


def counter(text: str, name: str, **labels: str) -> float:
    return sum(s.value for s in samples(text, [name]) if all(s.labels.get(k) == v for k, v in labels.items()))


def prompt_ids(seed: int) -> list[int]:
    """PROMPT_LEN token ids of the tiny model's vocabulary (512), different for each seed."""
    return [10 + (seed * 31 + i * 7) % 400 for i in range(PROMPT_LEN)]


def streamed_text(body: bytes) -> str:
    assert body.endswith(b"data: [DONE]\n\n"), body[-120:]
    events = [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e and e != b"data: [DONE]"]
    return "".join(c.get("text") or "" for e in events for c in orjson.loads(e)["choices"])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completion_decodes_from_the_prefill_engines_stored_kv(pd_pair: PdPair, stream: bool) -> None:
    body = {
        "model": SERVED_NAME,
        "prompt": prompt_ids(2 if stream else 1),
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    before_prefill, before_decode = scrape(pd_pair.prefill), scrape(pd_pair.decode)
    stored_before = set(pd_pair.storage.iterdir())

    status, routed = post(pd_pair.router, body)
    assert status == 200, routed
    generated = counter(before_decode, GENERATED) + 8
    wait_until(lambda: counter(scrape(pd_pair.decode), GENERATED) >= generated, 30, "decode metrics")
    after_prefill, after_decode = scrape(pd_pair.prefill), scrape(pd_pair.decode)

    # The prefill engine computed the prompt, generated one token and saved the prompt's KV.
    assert counter(after_prefill, GENERATED) - counter(before_prefill, GENERATED) == 1
    computed = counter(after_prefill, BY_SOURCE, source="local_compute")
    assert computed - counter(before_prefill, BY_SOURCE, source="local_compute") == PROMPT_LEN
    new_dirs = set(pd_pair.storage.iterdir()) - stored_before
    assert len(new_dirs) == 1 and any(p.suffix == ".safetensors" for p in next(iter(new_dirs)).iterdir())
    # The decode engine loaded the stored blocks instead of computing them, then generated the answer.
    loaded = counter(after_decode, BY_SOURCE, source="external_kv_transfer")
    loaded -= counter(before_decode, BY_SOURCE, source="external_kv_transfer")
    local = counter(after_decode, BY_SOURCE, source="local_compute")
    local -= counter(before_decode, BY_SOURCE, source="local_compute")
    assert loaded > 0 and loaded + local == PROMPT_LEN, (loaded, local)
    assert counter(after_decode, GENERATED) == generated

    # The same request to the engine that computed the prompt: the same text.
    status, reference = post(pd_pair.prefill, {**body, "stream": False})
    assert status == 200, reference
    expected = orjson.loads(reference)["choices"][0]["text"]
    text = streamed_text(routed) if stream else orjson.loads(routed)["choices"][0]["text"]
    assert text == expected

    router_metrics = scrape(pd_pair.router)
    assert counter(router_metrics, "corral_router_pd_handoffs_total", mode="storage") >= 1
    assert counter(router_metrics, "corral_router_pd_failures_total") == 0
