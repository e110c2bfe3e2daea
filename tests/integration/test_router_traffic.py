"""The router's per-endpoint traffic figures end to end: a real `corral router` in front of two `corral
sim` engines, one failing half its requests (`--fail-rate 0.5`, a 500 answer). After a mix of streamed
and non-streamed requests, `/v1/fleet` counts every 5xx the client got as an error of the failing
engine and none of the healthy one, each engine's requests agree with what the engine itself counted
(`vllm:request_success_total`, the 500s as finished_reason=error), the TTFT histograms are filled, and
`/metrics` shows the same counts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import orjson
import pytest

from corral.contracts.router import RouterFleet
from tests.integration.test_router_slow_start import start_router
from tests.support.procs import CorralProcess, start_sim
from tests.support.prom import sample

FAST = ("--seed", "7", "--ttft-base-ms", "5", "--itl-ms", "2", "--max-model-len", "256")
REQUESTS = 60  # half streamed
FINISHED = "vllm:request_success_total"


@pytest.fixture
def fleet() -> Iterator[tuple[str, str, str]]:
    procs: list[CorralProcess] = []
    try:
        failing, failing_url = start_sim(None, *FAST, "--fail-rate", "0.5")
        procs.append(failing)
        healthy, healthy_url = start_sim(None, *FAST)
        procs.append(healthy)
        router, router_url = start_router(
            "--backend", failing_url, "--backend", healthy_url, "--policy", "round_robin"
        )
        procs.append(router)
        yield router_url, failing_url, healthy_url
    finally:
        for proc in reversed(procs):
            proc.stop()


async def _one(s: aiohttp.ClientSession, router: str, i: int) -> int:
    stream = i % 4 < 2  # round robin alternates endpoints: each gets streams and non-streams
    body = {"model": "sim-model", "prompt": f"request {i}", "max_tokens": 4, "stream": stream}
    async with s.post(router + "/v1/completions", json=body) as resp:
        raw = await resp.read()
        if stream and resp.status == 200:
            assert raw.rstrip().endswith(b"data: [DONE]"), raw[-200:]
            assert b'"error"' not in raw, raw[-400:]
        return resp.status


def _engine_finished(text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(FINISHED + "{"))


async def test_fleet_traffic_counts_what_the_client_and_the_engines_saw(fleet: tuple[str, str, str]) -> None:
    router, failing, healthy = fleet
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        for _ in range(100):  # both engines routable
            async with s.get(router + "/v1/fleet") as resp:
                seen = RouterFleet.from_body(orjson.loads(await resp.read()))
            if sum(e.routable for e in seen.endpoints) == 2:
                break
            await asyncio.sleep(0.1)
        statuses: list[int] = []
        for start in range(0, REQUESTS, 6):  # a few at a time
            statuses += await asyncio.gather(*(_one(s, router, i) for i in range(start, start + 6)))
        async with s.get(router + "/v1/fleet") as resp:
            fleet_now = RouterFleet.from_body(orjson.loads(await resp.read()))
        async with s.get(router + "/metrics") as resp:
            metrics = (await resp.read()).decode()
        engine_counts = {}
        for url in (failing, healthy):
            async with s.get(url + "/metrics") as resp:
                engine_counts[url] = _engine_finished((await resp.read()).decode())

    failed = sum(1 for code in statuses if code >= 500)
    assert set(statuses) <= {200, 500}, statuses
    assert 0 < failed < REQUESTS, statuses  # the failing engine failed some, served others
    by_url = fleet_now.by_url()
    bad, good = by_url[failing].traffic, by_url[healthy].traffic
    assert bad is not None and good is not None
    print(
        f"\nclient: {failed} of {REQUESTS} failed; router: failing {bad.errors}/{bad.requests}, "
        f"healthy {good.errors}/{good.requests}; engines finished {engine_counts}"
    )
    assert bad.errors == failed and good.errors == 0
    assert bad.requests + good.requests == REQUESTS
    assert (bad.requests, good.requests) == (engine_counts[failing], engine_counts[healthy])
    # TTFT: every answer that was not a failure, less each endpoint's first (its warmup)
    assert good.warmup_ttft_s is not None and good.ttft.count == good.requests - 1
    assert bad.warmup_ttft_s is not None and bad.ttft.count == bad.requests - bad.errors - 1
    assert good.itl.count > 0 and (good.ttft.quantile(0.99) or 0) > 0
    assert fleet_now.totals is not None
    assert (fleet_now.totals.requests, fleet_now.totals.errors) == (REQUESTS, failed)

    requests = "corral_router_endpoint_requests_total"
    assert sample(metrics, requests, endpoint=failing, outcome="error") == failed
    assert sample(metrics, requests, endpoint=failing, outcome="ok") == bad.requests - failed
    assert sample(metrics, requests, endpoint=healthy, outcome="ok") == good.requests
    assert sample(metrics, requests, endpoint=healthy, outcome="error") == 0
    ttft_count = "corral_router_endpoint_ttft_seconds_count"
    assert sample(metrics, ttft_count, endpoint=healthy) == good.ttft.count
    assert sample(metrics, ttft_count, endpoint=failing) == bad.ttft.count
    assert sample(metrics, "corral_router_endpoint_warmup_ttft_seconds", endpoint=healthy) is not None
