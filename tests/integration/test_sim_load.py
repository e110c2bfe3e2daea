"""The simulator under load: prefix cache counting, the waiting queue, freed slots, faults, determinism."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import aiohttp
import pytest

from tests.support.procs import start_sim


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                return float(value)
    raise AssertionError(f"{name} {labels} not in metrics")


async def scrape(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as r:
        return await r.text()


@pytest.fixture(scope="module")
def small_sim() -> Iterator[str]:
    """Two running slots and slow tokens, so a handful of requests queue up."""
    proc, url = start_sim(None, "--max-num-seqs", "2", "--itl-ms", "20", "--block-size", "16")
    try:
        yield url
    finally:
        proc.stop()


async def test_prefix_cache_counts_queries_and_hits_in_tokens(small_sim: str) -> None:
    prompt = "The quick brown fox jumps over the lazy dog near the river bank. " * 8
    async with aiohttp.ClientSession() as s:
        async with s.post(small_sim + "/tokenize", json={"prompt": prompt}) as r:
            n = (await r.json())["count"]
        before = await scrape(s, small_sim)
        for _ in range(2):
            async with s.post(small_sim + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as r:
                assert r.status == 200
                assert (await r.json())["usage"]["prompt_tokens"] == n
        after = await scrape(s, small_sim)
    queries = metric(after, "vllm:prefix_cache_queries_total") - metric(
        before, "vllm:prefix_cache_queries_total"
    )
    hits = metric(after, "vllm:prefix_cache_hits_total") - metric(before, "vllm:prefix_cache_hits_total")
    assert queries == 2 * n
    assert hits == (n - 1) // 16 * 16  # second request only; whole blocks; last token recomputed


async def test_requests_beyond_max_num_seqs_wait_and_all_finish(small_sim: str) -> None:
    async with aiohttp.ClientSession() as s:

        async def one(i: int) -> int:
            body = {"prompt": f"request {i}", "max_tokens": 10}
            async with s.post(small_sim + "/v1/completions", json=body) as r:
                await r.read()
                return r.status

        tasks = [asyncio.create_task(one(i)) for i in range(8)]
        seen_waiting, max_running = 0.0, 0.0
        while not all(t.done() for t in tasks):
            text = await scrape(s, small_sim)
            seen_waiting = max(seen_waiting, metric(text, "vllm:num_requests_waiting"))
            max_running = max(max_running, metric(text, "vllm:num_requests_running"))
            await asyncio.sleep(0.02)
        assert [t.result() for t in tasks] == [200] * 8
        assert seen_waiting > 0
        assert max_running == 2
        text = await scrape(s, small_sim)
        assert metric(text, "vllm:num_requests_running") == 0
        assert metric(text, "vllm:kv_cache_usage_perc") == 0
        assert metric(text, "vllm:request_queue_time_seconds_count") >= 8


async def test_a_client_that_disconnects_frees_its_slot(small_sim: str) -> None:
    async with aiohttp.ClientSession() as s:
        streams = []
        for _ in range(2):
            resp = await s.post(
                small_sim + "/v1/completions", json={"prompt": "long", "max_tokens": 2000, "stream": True}
            )
            await resp.content.readuntil(b"\n\n")
            streams.append(resp)
        text = await scrape(s, small_sim)
        assert metric(text, "vllm:num_requests_running") == 2
        aborted_before = metric(text, "vllm:request_success_total", finished_reason="abort")
        for resp in streams:
            resp.close()
        async with s.post(
            small_sim + "/v1/completions",
            json={"prompt": "next", "max_tokens": 2},
            timeout=aiohttp.ClientTimeout(total=10),
        ) as r:
            assert r.status == 200
        text = await scrape(s, small_sim)
        assert metric(text, "vllm:request_success_total", finished_reason="abort") == aborted_before + 2


async def test_same_seed_and_request_give_the_same_text(small_sim: str) -> None:
    body = {
        "messages": [{"role": "user", "content": "tell me"}],
        "max_tokens": 12,
        "temperature": 0.8,
        "seed": 7,
    }
    async with aiohttp.ClientSession() as s:
        texts = []
        for seed in (7, 7, 8):
            async with s.post(small_sim + "/v1/chat/completions", json={**body, "seed": seed}) as r:
                texts.append((await r.json())["choices"][0]["message"]["content"])
        async with s.post(small_sim + "/v1/chat/completions", json={**body, "stream": True}) as r:
            streamed = "".join(re.findall(r'"content":"([^"]*)"', await r.text()))
    assert texts[0] == texts[1] == streamed
    assert texts[2] != texts[0]


async def test_stop_string_and_eos_finish_reasons(small_sim: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(
            small_sim + "/v1/completions", json={"prompt": "a", "stop": [".", ","], "max_tokens": 200}
        ) as r:
            choice = (await r.json())["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] in (".", ",")
        assert "." not in choice["text"] and "," not in choice["text"]
        async with s.post(small_sim + "/v1/completions", json={"prompt": "a"}) as r:
            choice = (await r.json())["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None


async def test_prompt_plus_max_tokens_over_the_limit_is_clamped() -> None:
    proc, url = start_sim(None, "--max-model-len", "64", "--itl-ms", "0")
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/completions", json={"prompt": " the" * 60, "max_tokens": 64}) as r:
                body = await r.json()
        assert r.status == 200
        assert body["usage"]["completion_tokens"] == 4
        assert body["choices"][0]["finish_reason"] == "length"
    finally:
        proc.stop()


async def test_fail_rate_answers_some_requests_with_vllm_500s() -> None:
    proc, url = start_sim(None, "--fail-rate", "0.5", "--seed", "3", "--itl-ms", "0")
    try:
        statuses = []
        async with aiohttp.ClientSession() as s:
            for _ in range(30):
                async with s.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}) as r:
                    statuses.append(r.status)
                    if r.status == 500:
                        err = (await r.json())["error"]
                        assert list(err) == ["message", "type", "param", "code"]
                        assert (err["type"], err["code"]) == ("InternalServerError", 500)
            async with s.get(url + "/health") as r:
                assert r.status == 200
        assert set(statuses) == {200, 500}
    finally:
        proc.stop()
