"""Placement by cost against real simulators with a slow prefill (issue 28): a burst of one group's
long questions spills to a second engine once the holder's queued prefill exceeds what its cached
system prompt saves, and a burst of short questions, which the holder's cache makes cheap, stays on
the holder. Which engine served each request is read from the sims' own counters."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import aiohttp

from tests.integration.test_router_passthrough import post, start_router
from tests.support.procs import start_sim


def by_cost(tmp_path: Path) -> tuple[str, str]:
    """The router's --policy-config for the built-in prefix policy placing by cost (issue 28; the
    default placement is still headroom)."""
    config = tmp_path / "routing.yaml"
    config.write_text("prefix_placement: cost\n")
    return ("--policy-config", str(config))


SYSTEM = "You answer questions about the tides and the sea charts of the bay. " * 18  # ~1,200 characters
# ~0.5 s of prefill for the long question alone: every pick of a burst is made before a first byte
SIM = ("--seed", "0", "--ttft-base-ms", "5", "--itl-ms", "2", "--max-model-len", "8192")
SLOW = ("--prefill-ms-per-token", "2")


def served(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=2.0) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


def body(user: int, question_chars: int) -> dict[str, object]:
    question = f"user {user} asks: " + f"what of wave {user} and its height? " * (question_chars // 36)
    return {
        "model": "sim-model",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ],
        "max_tokens": 2,
    }


async def _burst(url: str, users: range, question_chars: int) -> None:
    async with aiohttp.ClientSession() as s:
        got = await asyncio.gather(
            *(post(s, url + "/v1/chat/completions", body(u, question_chars)) for u in users)
        )
    assert [status for status, _, _ in got] == [200] * len(users)


def _served_by(urls: list[str], before: list[float]) -> list[int]:
    return [int(served(u) - b) for u, b in zip(urls, before, strict=True)]


def test_a_burst_spills_once_the_holders_queue_outweighs_its_hit_and_cheap_hits_stay(tmp_path: Path) -> None:
    sims = [start_sim(None, *SIM, *SLOW) for _ in range(2)]
    urls = [u for _, u in sims]
    router, url = start_router(*urls, extra=("--policy", "prefix", "--workers", "1", *by_cost(tmp_path)))
    try:
        before = [served(u) for u in urls]
        asyncio.run(_burst(url, range(1), 40))  # the group's first request: one engine holds it
        first = _served_by(urls, before)
        holder = first.index(1)
        # short questions: at the holder each costs a few tokens, elsewhere the whole system prompt
        before = [served(u) for u in urls]
        asyncio.run(_burst(url, range(1, 5), 40))
        cheap = _served_by(urls, before)
        assert cheap[holder] == 4, cheap
        # long questions (~2,000 characters, more than the system prompt): the second one waits less
        # behind an idle engine's whole prefill than behind the first one's question at the holder
        before = [served(u) for u in urls]
        asyncio.run(_burst(url, range(5, 9), 2000))
        costly = _served_by(urls, before)
        assert sorted(costly) == [2, 2], costly
    finally:
        router.stop()
        for proc, _ in sims:
            proc.stop()
