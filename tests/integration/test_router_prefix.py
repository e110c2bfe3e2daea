"""Prefix affinity against real simulators: the users of a group share one engine's prefix cache."""

from __future__ import annotations

import asyncio
import urllib.request

import aiohttp
import orjson

from tests.integration.test_router_passthrough import SIM_ARGS, post, start_router
from tests.support.procs import start_sim

SYSTEM = "You answer questions about the tides and the sea. " * 12  # ~600 characters


def cache_counters(url: str) -> tuple[float, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=2.0) as resp:
        text = resp.read().decode()
    values = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"]


async def _send_groups(url: str, groups: int, users: int) -> None:
    async with aiohttp.ClientSession() as s:
        for u in range(users):
            for g in range(groups):
                body = {
                    "model": "sim-model",
                    "messages": [
                        {"role": "system", "content": f"Group {g}. {SYSTEM}"},
                        {"role": "user", "content": f"user {u} asks about wave {u * 7}"},
                    ],
                    "max_tokens": 2,
                }
                status, _, _ = await post(s, url + "/v1/chat/completions", body)
                assert status == 200


def test_prefix_policy_keeps_each_group_on_one_engines_cache() -> None:
    """Six groups, first sent one at a time on an idle fleet: each new prefix goes to the engine with
    the most headroom (the fewest recent picks), not to its hash, so every engine holds two groups and
    serves their later users (hashing six groups onto three engines is even one time in eight)."""
    args = (*SIM_ARGS[:-2], "--max-model-len", "2048")
    sims = [start_sim(None, *args) for _ in range(3)]
    router, url = start_router(*(u for _, u in sims), extra=("--policy", "prefix"))
    try:
        asyncio.run(_send_groups(url, groups=6, users=4))
        queries = hits = 0.0
        for _, sim_url in sims:
            q, h = cache_counters(sim_url)
            queries += q
            hits += h
        # The first request of each group misses; the other three find its system prompt cached,
        # which is most of their prompt.
        assert hits / queries > 0.55, (hits, queries)
        with urllib.request.urlopen(url + "/v1/fleet", timeout=2.0) as resp:
            fleet = orjson.loads(resp.read())
        assert sum(e["requests_sent"] for e in fleet["endpoints"]) == 24
        assert [e["prefix_memory"]["keys"] for e in fleet["endpoints"]] == [2, 2, 2], fleet
        assert [e["requests_sent"] for e in fleet["endpoints"]] == [8, 8, 8], fleet
    finally:
        router.stop()
        for proc, _ in sims:
            proc.stop()
