"""Prefill/decode disaggregation through `corral router --prefill A --decode B` in front of real `corral sim`
engines speaking vLLM's P/D protocol (--kv-transfer-config): the requests succeed streamed and not, the
engines' own `vllm:` counters say the prefill engine generated one token per request and computed the
prompts, the decode engine generated the rest and computed no prefill; a prefill engine on another
vLLM version than a decode engine is never paired with it; and engines on a storage connector
(ExampleConnector: no params in the prefill answer) hand the KV over through their shared directory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from corral.engine import metric_names as names
from tests.integration.test_router_passthrough import SIM_ARGS, post, wait_routable
from tests.support.procs import CorralProcess, free_port, start_sim
from tests.support.prom import sample, scrape

MODEL = "sim-model"
PROMPT = "the tide comes in over the flats twice a day and the gulls follow it " * 4


def kv_config(role: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role})


def start_pd_sims(procs: list[CorralProcess], *specs: tuple[str, ...], port: int | None = None) -> list[str]:
    """Start one sim per (kv_role, vLLM version, *more flags), all at once, and wait until each answers."""
    urls = []
    for role, version, *more in specs:
        flags = ("--kv-transfer-config", kv_config(role), "--version-string", version, "--block-size", "16")
        proc, url = start_sim(port, *SIM_ARGS, *flags, *more, wait=False)
        procs.append(proc)
        urls.append(url)
    for proc, url in zip(procs[-len(specs) :], urls, strict=True):
        proc.wait_http(url + "/health")
    return urls


def start_pd_router(
    prefill: list[str], decode: list[str], routable: int, *extra: str
) -> tuple[CorralProcess, str]:
    port = free_port()
    args = ["router", "--host", "127.0.0.1", "--port", str(port), "--models-refresh-seconds", "0.5", *extra]
    args += [a for url in prefill for a in ("--prefill", url)]
    args += [a for url in decode for a in ("--decode", url)]
    proc = CorralProcess(args)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/v1/fleet")
    wait_routable(proc, url, routable)
    return proc, url


def metric(url: str, name: str, **labels: str) -> float:
    value = sample(scrape(url + "/metrics"), name, **labels)
    assert value is not None, f"{url}: {name} {labels} missing"
    return value


@pytest.fixture
def procs() -> Iterator[list[CorralProcess]]:
    started: list[CorralProcess] = []
    try:
        yield started
    finally:
        for proc in reversed(started):
            proc.stop()


def chat(max_tokens: int, stream: bool) -> dict[str, object]:
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def completion(max_tokens: int, stream: bool) -> dict[str, object]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "stream": stream}


async def test_prefill_then_decode_through_the_router(procs: list[CorralProcess]) -> None:
    p_url, d_url = start_pd_sims(procs, ("kv_producer", "0.33.0"), ("kv_consumer", "0.33.0"))
    router, url = start_pd_router([p_url], [d_url], routable=2)
    procs.append(router)

    cases = [
        ("/v1/chat/completions", chat(7, stream=False)),
        ("/v1/chat/completions", chat(9, stream=True)),
        ("/v1/completions", completion(6, stream=False)),
        ("/v1/completions", completion(8, stream=True)),
    ]
    async with aiohttp.ClientSession() as s:
        for path, body in cases:
            status, headers, answer = await post(s, url + path, body)
            assert status == 200, answer
            if body["stream"]:
                assert str(headers["Content-Type"]).startswith("text/event-stream")
                assert answer.endswith(b"data: [DONE]\n\n") and b'"finish_reason":"length"' in answer
                assert b'"error"' not in answer
            else:
                usage = orjson.loads(answer)["usage"]
                assert usage["completion_tokens"] == body["max_tokens"]

    requests = len(cases)
    generated = sum(int(str(body["max_tokens"])) for _, body in cases)
    # the prefill engine generated one token per request, the decode engine every token the client got
    assert metric(p_url, names.GENERATION_TOKENS) == requests
    assert metric(d_url, names.GENERATION_TOKENS) == generated
    # the decode engine computed no prefill: every prompt token it saw came over a transfer
    d_prompt = metric(d_url, names.PROMPT_TOKENS)
    assert d_prompt > 0
    assert metric(d_url, names.PROMPT_TOKENS_BY_SOURCE, source="local_compute") == 0
    # what its own prefix cache did not hold (the prompt repeats) came over a transfer
    transferred = metric(d_url, names.PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer")
    cached = metric(d_url, names.PROMPT_TOKENS_BY_SOURCE, source="local_cache_hit")
    assert transferred > 0 and transferred + cached == d_prompt
    assert metric(p_url, names.PROMPT_TOKENS) == d_prompt
    assert metric(p_url, names.SIM_KV_TRANSFERS_HELD) == 0  # every transfer was pulled
    assert metric(url, "corral_router_pd_pairs_total", prefill=p_url, decode=d_url) == requests
    assert metric(url, "corral_router_pd_transfer_seconds_count") == requests


async def test_a_prefill_engine_is_never_paired_with_another_vllm_version(procs: list[CorralProcess]) -> None:
    p_url, old_url = start_pd_sims(procs, ("kv_producer", "0.33.0"), ("kv_consumer", "0.32.0"))
    new_port = free_port()
    new_url = f"http://127.0.0.1:{new_port}"  # a decode engine of the prefill's version, started later
    router, url = start_pd_router([p_url], [old_url, new_url], routable=2)
    procs.append(router)
    async with aiohttp.ClientSession() as s:
        status, headers, answer = await post(s, url + "/v1/chat/completions", chat(4, stream=False))
        assert status == 503 and int(str(headers["Retry-After"])) >= 1
        message = orjson.loads(answer)["error"]["message"]
        assert "vLLM version" in message and "127.0.0.1" not in message  # the engines: in the log only
        assert headers["X-Request-Id"] in message
    logged = [line for line in router.output().splitlines() if headers["X-Request-Id"] in line]
    # the log line is the contract: the client gets the request id, the operator finds the engine by it
    assert len(logged) == 1 and p_url in logged[0] and old_url in logged[0], router.output()
    assert metric(p_url, names.GENERATION_TOKENS) == 0  # no prefill leg for a pair that cannot be

    start_pd_sims(procs, ("kv_consumer", "0.33.0"), port=new_port)
    wait_routable(router, url, 3)
    async with aiohttp.ClientSession() as s:
        for i in range(6):
            status, _, answer = await post(s, url + "/v1/chat/completions", chat(3, stream=i % 2 == 1))
            assert status == 200, answer
    assert metric(new_url, names.GENERATION_TOKENS) == 6 * 3
    assert metric(old_url, names.GENERATION_TOKENS) == 0
    assert metric(old_url, names.PROMPT_TOKENS) == 0


async def test_a_failed_kv_pull_is_retried_with_a_fresh_prefill(procs: list[CorralProcess]) -> None:
    bad, good, d_url = start_pd_sims(
        procs,
        ("kv_producer", "0.33.0", "--fail-kv-transfer", "1"),  # every pull of its blocks fails
        ("kv_producer", "0.33.0"),
        ("kv_consumer", "0.33.0"),
    )
    router, url = start_pd_router([bad, good], [d_url], 3, "--policy", "round_robin")
    procs.append(router)
    async with aiohttp.ClientSession() as s:
        # round robin: a prefill leg on the failing engine is followed by one on the other (three
        # requests: within the retry budget's floor of three retries)
        for _ in range(3):
            status, _, answer = await post(s, url + "/v1/completions", completion(5, stream=False))
            assert status == 200, answer
            assert orjson.loads(answer)["usage"]["completion_tokens"] == 5
    # each pull from `bad` failed, and a fresh prefill on `good` followed it
    failed = metric(d_url, names.NIXL_FAILED_TRANSFERS)
    assert failed >= 1
    assert metric(url, "corral_router_pd_failures_total", leg="decode", why="engine_error") == failed
    assert metric(url, "corral_router_retries_total") == failed
    assert metric(url, "corral_router_pd_pairs_total", prefill=good, decode=d_url) == 3
    assert metric(d_url, names.GENERATION_TOKENS) == 3 * 5  # a failed load generated nothing


def folders(path: Path) -> int:
    return sum(p.is_dir() for p in path.iterdir())


def example_connector(role: str, storage: Path) -> str:
    extra = {"shared_storage_path": str(storage)}
    return json.dumps(
        {"kv_connector": "ExampleConnector", "kv_role": role, "kv_connector_extra_config": extra}
    )


async def test_a_storage_connector_hands_the_kv_over_through_its_shared_directory(
    procs: list[CorralProcess], tmp_path: Path
) -> None:
    """ExampleConnector engines answer the prefill leg without params; the router sends the decode engine
    the client's body and it loads the prompt's whole blocks from the directory the prefill engine wrote."""
    urls = []
    for role in ("kv_producer", "kv_consumer"):
        flags = ("--kv-transfer-config", example_connector(role, tmp_path), "--block-size", "16")
        proc, engine = start_sim(None, *SIM_ARGS, *flags, wait=False)
        procs.append(proc)
        urls.append(engine)
    for proc, engine in zip(procs, urls, strict=True):
        proc.wait_http(engine + "/health")
    p_url, d_url = urls
    router, url = start_pd_router([p_url], [d_url], routable=2)
    procs.append(router)

    # 100 token ids: ExampleConnector saves the first 96 (whole blocks of n - 1) and loads them back
    prompts = [[10 + (seed * 13 + i * 7) % 300 for i in range(100)] for seed in (1, 2)]
    async with aiohttp.ClientSession() as s:
        for prompt, stream in zip(prompts, (False, True), strict=True):
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 5, "stream": stream}
            status, _, answer = await post(s, url + "/v1/completions", body)
            assert status == 200, answer
            assert b'"error"' not in answer and (not stream or answer.endswith(b"data: [DONE]\n\n"))

    assert folders(tmp_path) == 2  # one per prompt, written by the prefill engine
    assert metric(p_url, names.GENERATION_TOKENS) == 2
    assert metric(p_url, names.PROMPT_TOKENS_BY_SOURCE, source="local_compute") == 200
    assert metric(d_url, names.GENERATION_TOKENS) == 2 * 5
    assert metric(d_url, names.PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer") == 2 * 96
    assert metric(d_url, names.PROMPT_TOKENS_BY_SOURCE, source="local_compute") == 2 * 4
    assert metric(p_url, names.SIM_KV_TRANSFERS_HELD) == 0  # nothing held for a pull
    assert metric(url, "corral_router_pd_handoffs_total", mode="storage") == 2
    assert metric(url, "corral_router_pd_pairs_total", prefill=p_url, decode=d_url) == 2
