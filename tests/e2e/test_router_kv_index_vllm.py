"""The router's KV index fed by a real vLLM engine (CPU build, the shared engine with KV events): the
router's subscription receives what the engine publishes, translates vLLM's own block hashes (seeded,
hashed as vLLM pleases) to content keys, and finds for a prompt exactly the blocks the engine cached:
the whole prompt's full blocks for a prompt it served, only the shared ones for a prompt that extends
another's prefix."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from corral.engine_state import EngineState
from corral.router.discovery.kv_events_feed import KvEventFeeds
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.kv_index import KvIndex, content_chain
from tests.e2e.conftest import SERVED_NAME, VllmKvEvents

pytestmark = pytest.mark.e2e


async def _held(feeds: KvEventFeeds, url: str, ids: list[int], want: int) -> int:
    """The blocks of `ids` the index says `url` holds, once it says `want` (or after 60 s)."""
    deadline = time.monotonic() + 60
    held = 0
    while time.monotonic() < deadline:
        size = feeds.index.block_size(url)
        if size is not None:
            held = feeds.index.longest(content_chain(ids, size)).get(url, 0)
            if held >= want:
                break
        await asyncio.sleep(0.2)
    return held


async def test_the_router_index_holds_what_vllm_cached(
    vllm_engine: str, vllm_kv_events: VllmKvEvents
) -> None:
    # longer than one of vLLM's blocks (128 tokens on the CPU build) and within the tiny model's 256:
    # a prompt shorter than a block caches no full block, so the engine publishes nothing
    tag = f"router index {time.monotonic_ns()}: "
    base = tag + "the tide rises and falls twice a day, pulled by the moon and the sun. " * 4
    endpoint = Endpoint(
        vllm_engine,
        state=EngineState.READY,
        kv_events=f"{vllm_kv_events.endpoint},{vllm_kv_events.replay}",
    )
    feeds = KvEventFeeds(KvIndex(), lambda: [endpoint])
    await feeds.start()
    try:
        # subscribed before the engine caches the prompt (a PUB drops what it sends before the SUB joins)
        for _ in range(300):
            if (feeds.to_json(vllm_engine) or {}).get("replays", 0) >= 1:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        async with httpx.AsyncClient(timeout=120.0) as client:

            async def tokens(prompt: str) -> list[int]:
                body = {"model": SERVED_NAME, "prompt": prompt}
                ids: list[int] = (await client.post(vllm_engine + "/tokenize", json=body)).json()["tokens"]
                return ids

            first = await tokens(base)
            other = await tokens(base + " And the sea keeps every secret it was told.")
            answer = await client.post(
                vllm_engine + "/v1/completions",
                json={"model": SERVED_NAME, "prompt": first, "max_tokens": 1, "temperature": 0},
            )
            assert answer.status_code == 200, (len(first), answer.text)
        held = await _held(feeds, vllm_engine, first, want=1)
        size = feeds.index.block_size(vllm_engine)
        assert size is not None, str(feeds.to_json(vllm_engine))
        # vLLM caches the prompt's full blocks (the last token is always recomputed, so a prompt of
        # whole blocks keeps its last one out)
        assert held == (len(first) - 1) // size, (held, len(first), size, feeds.to_json(vllm_engine))
        # a prompt never sent that extends the first one's text: only the blocks they share are held
        shared = next((i for i, (a, b) in enumerate(zip(first, other, strict=False)) if a != b), len(first))
        assert feeds.index.longest(content_chain(other, size)).get(vllm_engine, 0) == min(
            held, shared // size
        )
    finally:
        await feeds.stop()
