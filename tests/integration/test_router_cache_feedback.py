"""The router's prefix memory learns what an engine forgot (issue 28 item 4), against real simulators
run with `--enable-prompt-tokens-details`: once the engine holding a document has evicted it (other
prompts sent to it directly, which the router never saw), the next answer from it says nothing was
cached, and the router forgets that the engine holds the document."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import aiohttp
import orjson

from tests.integration.test_router_passthrough import post, start_router
from tests.support.procs import start_sim


def by_cost(tmp_path: Path) -> tuple[str, str]:
    """The router's --policy-config for the built-in prefix policy placing by cost (issue 28; the
    default placement is still headroom)."""
    config = tmp_path / "routing.yaml"
    config.write_text("prefix_placement: cost\n")
    return ("--policy-config", str(config))


DOCUMENT = "The tide tables of the northern bay, corrected for the spring equinox. " * 30  # ~2,100 chars
# a cache of 64 blocks of 16 tokens: a few prompts of this size evict the document
SIM = ("--seed", "0", "--max-model-len", "4096", "--kv-cache-blocks", "64", "--enable-prompt-tokens-details")


def keys_held(url: str) -> dict[str, int]:
    with urllib.request.urlopen(url + "/v1/fleet", timeout=2.0) as resp:
        fleet = orjson.loads(resp.read())
    return {e["url"]: e["prefix_memory"]["keys"] for e in fleet["endpoints"]}


async def _complete(url: str, prompt: str) -> dict[str, object]:
    async with aiohttp.ClientSession() as s:
        status, _, body = await post(
            s, url + "/v1/completions", {"model": "sim-model", "prompt": prompt, "max_tokens": 2}
        )
    assert status == 200
    usage: dict[str, object] = orjson.loads(body)["usage"]
    return usage


def test_an_engine_that_evicted_a_document_is_forgotten_as_its_holder(tmp_path: Path) -> None:
    sims = [start_sim(None, *SIM) for _ in range(2)]
    router, url = start_router(
        *(u for _, u in sims), extra=("--policy", "prefix", "--workers", "1", *by_cost(tmp_path))
    )
    try:
        asyncio.run(_complete(url, DOCUMENT + "question 0"))
        held = keys_held(url)
        holder = next(u for u, keys in held.items() if keys)
        usage = asyncio.run(_complete(url, DOCUMENT + "question 1"))  # a hit, reported as one
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0, usage
        assert keys_held(url)[holder] == 1
        for i in range(6):  # other prompts straight to the holder: its cache evicts the document
            asyncio.run(_complete(holder, f"Unrelated notes, part {i}. " * 90))
        usage = asyncio.run(_complete(url, DOCUMENT + "question 2"))
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0, usage  # the engine cached none of it
        assert keys_held(url)[holder] == 0
    finally:
        router.stop()
        for proc, _ in sims:
            proc.stop()
