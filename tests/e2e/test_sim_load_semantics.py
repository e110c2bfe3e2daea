"""The simulator against a real vLLM CPU engine under the same concurrent shared-prefix load, compared on
the semantics Corral reads (not on numbers: a random tiny model on 2 CPUs against a model of time):

- `vllm:kv_cache_usage_perc` rises while requests run and is 0 again once idle (it counts only the blocks
  running requests reference; cached-but-free blocks do not count);
- `vllm:num_requests_waiting` > 0 while more requests than `--max-num-seqs` are in flight, 0 after;
- `vllm:num_requests_running` never above `--max-num-seqs`;
- the prefix-cache counters grow and the repeated prefix gives a hit share > 0;
- with `--enable-prompt-tokens-details` every answer's usage says `cached_tokens` (0 on a miss), some > 0,
  with the same keys in both.

The metrics are sampled by polling /metrics while the load runs; assertions are on what was observed.
One engine for the module (`--max-num-seqs 2`, prompt-token details on): about 35-60 s of CI time.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from corral.engine import metric_names as vllm
from tests.e2e.conftest import SERVED_NAME, start_engine, stop_engine, vllm_command
from tests.support.procs import CorralProcess, free_port, start_sim
from tests.support.waits import wait_http_200, wait_until

pytestmark = pytest.mark.e2e

MAX_NUM_SEQS = 2
CONCURRENCY = 8  # four times the running slots: six wait at first
MAX_MODEL_LEN = 512
MAX_TOKENS = 160  # long enough streams that polling sees the queue (tiny-model steps take ~ms)
ENGINE_FLAGS = ("--max-num-seqs", str(MAX_NUM_SEQS), "--enable-prompt-tokens-details")
GAUGES = (vllm.KV_USAGE, vllm.RUNNING, vllm.WAITING, vllm.PREFIX_CACHE_HITS, vllm.PREFIX_CACHE_QUERIES)
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)$", re.MULTILINE)
# ~280 tokens of the tiny model's corpus words: two full blocks of the CPU engine's default 128 tokens,
# more of the simulator's 16; with MAX_TOKENS within the 512 positions
PREFIX = "You are the harbour master. " + " ".join(
    random.Random(28).choice("the sea ship story token cache prefix once upon time".split())
    for _ in range(270)
)


@pytest.fixture(scope="module")
def loaded_vllm(
    vllm_python: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A real engine with few running slots and prompt-token details: the shared engine has neither."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm-load") / "engine.log"
    command = vllm_command(
        vllm_python, tiny_model, port, *ENGINE_FLAGS, "--max-model-len", str(MAX_MODEL_LEN)
    )
    proc = start_engine(command, log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_200(url + "/health", timeout=300, alive=lambda: proc.poll() is None)
        yield url
    finally:
        stop_engine(proc, log_path)


@pytest.fixture(scope="module")
def loaded_sim() -> Iterator[str]:
    proc: CorralProcess
    proc, url = start_sim(None, *ENGINE_FLAGS, "--max-model-len", str(MAX_MODEL_LEN), model=SERVED_NAME)
    try:
        yield url
    finally:
        proc.stop()


def gauges(text: str) -> dict[str, float]:
    """The samples of `GAUGES` in an exposition (one engine: no label sums needed)."""
    return {name: float(value) for name, value in SAMPLE.findall(text) if name in GAUGES}


@dataclass
class Observed:
    """What polling an engine's /metrics saw over one load, and the answers' usage."""

    before: dict[str, float]
    during: list[dict[str, float]] = field(default_factory=list)
    after: dict[str, float] = field(default_factory=dict)
    usages: list[dict[str, Any]] = field(default_factory=list)

    def peak(self, name: str) -> float:
        return max(s[name] for s in self.during)

    def delta(self, name: str) -> float:
        return self.after[name] - self.before[name]


async def stream_usage(client: httpx.AsyncClient, url: str, i: int) -> dict[str, Any]:
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "system", "content": PREFIX}, {"role": "user", "content": f"Question {i}?"}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage: dict[str, Any] | None = None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: {") and '"usage"' in line:
                usage = orjson.loads(line[len("data: ") :])["usage"]
    assert usage is not None
    return usage


async def load(url: str) -> Observed:
    """`CONCURRENCY` streams at once sharing `PREFIX`, /metrics polled until they have all answered."""
    async with httpx.AsyncClient(timeout=120) as client:
        observed = Observed(gauges((await client.get(url + "/metrics")).text))
        streams = asyncio.gather(*(stream_usage(client, url, i) for i in range(CONCURRENCY)))
        while not streams.done():
            observed.during.append(gauges((await client.get(url + "/metrics")).text))
            await asyncio.wait([streams], timeout=0.01)
        observed.usages = streams.result()
    return observed


def idle(url: str) -> dict[str, float]:
    """The metrics once the engine says nothing runs or waits (its gauges lag the last answer a little)."""
    seen: dict[str, float] = {}

    def settled() -> bool:
        seen.update(gauges(httpx.get(url + "/metrics").text))
        return seen[vllm.RUNNING] == 0 and seen[vllm.WAITING] == 0

    wait_until(settled, 30, f"{url} idle")
    return seen


def run(url: str) -> Observed:
    observed = asyncio.run(load(url))
    observed.after = idle(url)
    return observed


@pytest.fixture(scope="module")
def observed(loaded_vllm: str, loaded_sim: str) -> dict[str, Observed]:
    return {"vllm": run(loaded_vllm), "sim": run(loaded_sim)}


@pytest.mark.parametrize("engine", ["vllm", "sim"])
def test_kv_usage_rises_under_load_and_returns_to_zero(observed: dict[str, Observed], engine: str) -> None:
    o = observed[engine]
    assert o.before[vllm.KV_USAGE] == 0
    assert 0 < o.peak(vllm.KV_USAGE) <= 1
    # cached blocks stay cached (the counters below show hits) but are no longer referenced: not counted
    assert o.after[vllm.KV_USAGE] == 0


@pytest.mark.parametrize("engine", ["vllm", "sim"])
def test_requests_wait_beyond_max_num_seqs_and_not_after(observed: dict[str, Observed], engine: str) -> None:
    o = observed[engine]
    assert o.peak(vllm.WAITING) > 0
    assert 0 < o.peak(vllm.RUNNING) <= MAX_NUM_SEQS
    assert max(s[vllm.RUNNING] + s[vllm.WAITING] for s in o.during) <= CONCURRENCY
    assert o.after[vllm.WAITING] == 0 and o.after[vllm.RUNNING] == 0


@pytest.mark.parametrize("engine", ["vllm", "sim"])
def test_the_shared_prefix_hits(observed: dict[str, Observed], engine: str) -> None:
    o = observed[engine]
    queries, hits = o.delta(vllm.PREFIX_CACHE_QUERIES), o.delta(vllm.PREFIX_CACHE_HITS)
    assert queries >= sum(u["prompt_tokens"] for u in o.usages)
    assert 0 < hits < queries, (o.before, o.after)
    # the counters and the answers agree on what the cache served
    assert hits == sum(u["prompt_tokens_details"]["cached_tokens"] for u in o.usages)


def test_cached_tokens_are_reported_alike(observed: dict[str, Observed]) -> None:
    for engine, o in observed.items():
        cached = [u["prompt_tokens_details"]["cached_tokens"] for u in o.usages]
        assert all(isinstance(c, int) for c in cached), (engine, o.usages)
        assert any(c > 0 for c in cached), (engine, cached)
        assert any(c == 0 for c in cached), (engine, cached)  # the first computes the prefix: a miss, said
    keys = {
        engine: {frozenset(u["prompt_tokens_details"]) for u in o.usages} for engine, o in observed.items()
    }
    assert keys["sim"] == keys["vllm"]
