"""Two `corral sim` processes, a prefill and a decode engine, driven by hand with vLLM's P/D bodies
(engine/pd_protocol.py): the decode engine pulls the prompt's blocks from the prefill engine over the
side channel instead of computing the prefill, and the counters say who did what. Real processes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from corral.engine import metric_names as names
from corral.engine import pd_protocol as pd
from tests.support.procs import CorralProcess, free_port
from tests.support.prom import sample, scrape

PROMPT = "the quick brown fox jumps over the lazy dog " * 8


def kv_config(role: str, lease: float = 30.0) -> str:
    extra = {"kv_lease_duration": lease}
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role, "kv_connector_extra_config": extra})


def start(*extra: str) -> tuple[CorralProcess, str]:
    port = free_port()
    proc = CorralProcess(["sim", "--port", str(port), "--model", "m", "--block-size", "16", *extra])
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    return proc, url


@pytest.fixture
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """A prefill engine (extra flags given as the fixture's parameter) and a decode engine."""
    flags: tuple[str, ...] = getattr(request, "param", ())
    prefill, p_url = start("--kv-transfer-config", kv_config("kv_producer"), *flags)
    try:
        decode, d_url = start("--kv-transfer-config", kv_config("kv_consumer"))
        try:
            yield p_url, d_url
        finally:
            decode.stop()
    finally:
        prefill.stop()


async def post(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with s.post(url, json=body) as r:
        return r.status, await r.json(content_type=None)


def metric(url: str, name: str, **labels: str) -> float:
    value = sample(scrape(url + "/metrics"), name, **labels)
    assert value is not None, f"{name} {labels} missing"
    return value


async def test_decode_continues_a_transferred_prompt(pair: tuple[str, str]) -> None:
    p_url, d_url = pair
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    chat = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 9, "stream": True}
    async with aiohttp.ClientSession() as s:
        status, answer = await post(s, p_url + "/v1/completions", pd.prefill_leg_body(body))
        assert status == 200 and answer["usage"]["completion_tokens"] == 1
        params = pd.transfer_params_of(answer)
        assert params is not None
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["remote_port"] == int(p_url.rsplit(":", 1)[1])
        prompt_tokens = answer["usage"]["prompt_tokens"]
        assert len(params["remote_block_ids"][0]) == -(-prompt_tokens // 16)
        assert metric(p_url, names.SIM_KV_TRANSFERS_HELD) == 1
        assert metric(p_url, names.KV_USAGE) > 0  # held blocks stay allocated

        status, done = await post(s, d_url + "/v1/completions", pd.decode_leg_body(body, params))
        assert status == 200 and done["usage"]["completion_tokens"] == 12
        assert done["kv_transfer_params"] is None
        # the same request aggregated on one engine gives the same text: decode continued the prompt
        status, alone = await post(s, p_url + "/v1/completions", body)
        assert done["choices"][0]["text"] == alone["choices"][0]["text"]

        # a streamed chat through both legs
        status, answer = await post(s, p_url + "/v1/chat/completions", pd.prefill_leg_body(chat))
        assert status == 200
        chat_params = pd.transfer_params_of(answer)
        assert chat_params is not None
        async with s.post(d_url + "/v1/chat/completions", json=pd.decode_leg_body(chat, chat_params)) as r:
            text = await r.text()
        assert r.status == 200 and text.endswith("data: [DONE]\n\n") and '"finish_reason":"length"' in text

    assert metric(p_url, names.SIM_KV_TRANSFERS_HELD) == 0  # freed once pulled
    # the prefill engine generated one token per P/D request (plus the 12 of the aggregated one)
    assert metric(p_url, names.GENERATION_TOKENS) == 1 + 12 + 1
    assert metric(d_url, names.GENERATION_TOKENS) == 12 + 9
    # the decode engine computed no prefill: every prompt token it saw came over the transfer
    d_prompt = metric(d_url, names.PROMPT_TOKENS)
    assert d_prompt > 0
    assert metric(d_url, names.PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer") == d_prompt
    assert metric(d_url, names.PROMPT_TOKENS_BY_SOURCE, source="local_compute") == 0
    assert metric(p_url, names.PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer") == 0
    assert metric(d_url, names.NIXL_XFER_TIME + "_count") == 2
    assert metric(d_url, names.NIXL_BYTES_TRANSFERRED + "_sum") > 0
    assert metric(d_url, names.NIXL_FAILED_TRANSFERS) == 0
    assert metric(d_url, names.SIM_KV_PULLS_IN_FLIGHT) == 0


@pytest.mark.parametrize("pair", [("--kv-transfer-config", kv_config("kv_producer", lease=1))], indirect=True)
async def test_expired_transfer_frees_blocks_and_fails_the_pull(pair: tuple[str, str]) -> None:
    p_url, d_url = pair
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 5}
    async with aiohttp.ClientSession() as s:
        _, answer = await post(s, p_url + "/v1/completions", pd.prefill_leg_body(body))
        params = pd.transfer_params_of(answer)
        assert params is not None and metric(p_url, names.SIM_KV_TRANSFERS_HELD) == 1
        for _ in range(100):  # the 1 s lease runs out
            if metric(p_url, names.SIM_KV_TRANSFERS_HELD) == 0:
                break
            await asyncio.sleep(0.05)
        assert metric(p_url, names.SIM_KV_TRANSFERS_HELD) == 0
        assert metric(p_url, names.NIXL_KV_EXPIRED_REQS) == 1
        assert metric(p_url, names.KV_USAGE) == 0
        status, failed = await post(s, d_url + "/v1/completions", pd.decode_leg_body(body, params))
    # kv_load_failure_policy "fail" (vLLM's default): the request finishes with an error, a 500
    assert status == 500 and failed["error"]["type"] == "InternalServerError"
    assert metric(p_url, names.NIXL_NOTIFICATIONS_AFTER_EXPIRY) == 1
    assert metric(d_url, names.NIXL_FAILED_TRANSFERS) == 1
    assert metric(d_url, names.FINISHED, finished_reason="error") == 1
    assert metric(d_url, names.GENERATION_TOKENS) == 0


@pytest.mark.parametrize("pair", [("--fail-kv-transfer", "1.0")], indirect=True)
async def test_failed_transfer_fails_the_request_and_strands_the_blocks(pair: tuple[str, str]) -> None:
    p_url, d_url = pair
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 5, "stream": True}
    async with aiohttp.ClientSession() as s:
        _, answer = await post(s, p_url + "/v1/completions", pd.prefill_leg_body(body))
        params = pd.transfer_params_of(answer)
        assert params is not None
        async with s.post(d_url + "/v1/completions", json=pd.decode_leg_body(body, params)) as r:
            text = await r.text()
    # streamed: the error arrives as an in-stream event, then [DONE], as vLLM ends a failed stream
    assert r.status == 200 and '"InternalServerError"' in text and text.endswith("data: [DONE]\n\n")
    assert metric(d_url, names.NIXL_FAILED_TRANSFERS) == 1
    assert metric(d_url, names.GENERATION_TOKENS) == 0
    assert metric(p_url, names.SIM_KV_TRANSFERS_HELD) == 1  # nobody pulled them: held until the lease


async def test_recompute_policy_prefills_locally() -> None:
    config = json.loads(kv_config("kv_consumer"))
    config["kv_load_failure_policy"] = "recompute"
    decode, d_url = start("--kv-transfer-config", json.dumps(config))
    try:
        params = {
            "do_remote_prefill": True,
            "remote_engine_id": "gone",
            "remote_request_id": "r1",
            "remote_host": "127.0.0.1",
            "remote_port": free_port(),
            "remote_block_ids": [[0]],
            "tp_size": 1,
        }
        body = {"model": "m", "prompt": PROMPT, "max_tokens": 3}
        async with aiohttp.ClientSession() as s:
            status, done = await post(s, d_url + "/v1/completions", pd.decode_leg_body(body, params))
        assert status == 200 and done["usage"]["completion_tokens"] == 3
        assert metric(d_url, names.NIXL_FAILED_TRANSFERS) == 1
        assert (
            metric(d_url, names.PROMPT_TOKENS_BY_SOURCE, source="local_compute")
            == done["usage"]["prompt_tokens"]
        )
    finally:
        decode.stop()


def test_bad_kv_transfer_config_is_refused() -> None:
    proc = CorralProcess(["sim", "--port", str(free_port()), "--kv-transfer-config", '{"kv_connector": "X"}'])
    code = proc.wait_exit(20)
    assert code == 2
    # the log line is the contract: vLLM writes it so, and the supervisor and operators read it
    assert "kv_role" in proc.output()


@pytest.mark.parametrize(
    "pair", [("--hang-kv-transfer", "--kv-transfer-config", kv_config("kv_producer", lease=2))], indirect=True
)
async def test_hung_transfer_shows_as_held_and_in_flight_until_the_lease(pair: tuple[str, str]) -> None:
    p_url, d_url = pair
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 5}
    async with aiohttp.ClientSession() as s:
        _, answer = await post(s, p_url + "/v1/completions", pd.prefill_leg_body(body))
        params = pd.transfer_params_of(answer)
        assert params is not None
        decode_leg = asyncio.create_task(post(s, d_url + "/v1/completions", pd.decode_leg_body(body, params)))
        for _ in range(100):
            if metric(d_url, names.SIM_KV_PULLS_IN_FLIGHT) == 1:
                break
            await asyncio.sleep(0.02)
        # what a drain reads: the prefill still holds the blocks, the decode's pull is in progress
        assert metric(p_url, names.SIM_KV_TRANSFERS_HELD) == 1
        assert metric(d_url, names.SIM_KV_PULLS_IN_FLIGHT) == 1
        assert metric(d_url, names.KV_FETCH_BY_STAGE, stage="in_progress") == 1
        status, _ = await decode_leg
    assert status == 500
    assert metric(p_url, names.SIM_KV_TRANSFERS_HELD) == 0 and metric(p_url, names.NIXL_KV_EXPIRED_REQS) == 1
    assert metric(d_url, names.SIM_KV_PULLS_IN_FLIGHT) == 0
