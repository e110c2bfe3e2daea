"""`corral router --flow-control` with tenants in front of a real `corral sim` of one slot, the router
holding what the engine cannot take: a high-priority request overtakes a heavy tenant's flood, a light
tenant goes ahead of it, a sheddable one is answered 429 with Retry-After at once, a client that hangs up
leaves the queue, and every request is accounted for (answered, 429, or its client gone).

One slot and --flow-engine-max-in-flight 1 make the order of dispatch the order of completion; without
flow control every request goes to the engine at once and its FIFO serves the flood first."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from corral.engine.metrics_text import samples
from tests.support.procs import CorralProcess, free_port, start_sim
from tests.support.waits import eventually, eventually_awaited

KEYS = {
    "heavy": "heavy-tenant-key-0123456789",
    "light": "light-tenant-key-0123456789",
    "high": "high-tenant-key-01234567890",
    "batch": "batch-tenant-key-0123456789",
}
KEYS_FILE = f"""
- name: heavy
  key: {KEYS["heavy"]}
- name: light
  key: {KEYS["light"]}
- name: high
  key: {KEYS["high"]}
  priority: 10
- name: batch
  key: {KEYS["batch"]}
  priority: -1
"""
FLOOD = 12
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@pytest.fixture(scope="module", params=["lean", "aiohttp"])
def router(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[str]:
    """The router on each server: both cancel a request whose client hangs up (the lean server's
    connection_lost, aiohttp's handler_cancellation), which is how a waiting request leaves the queue."""
    keys = tmp_path_factory.mktemp("flow") / "keys.yaml"
    keys.write_text(KEYS_FILE)
    os.chmod(keys, 0o600)
    sim, sim_url = start_sim(None, "--max-num-seqs", "1", "--itl-ms", "15", "--ttft-base-ms", "2")
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--backend", sim_url]
    args += ["--api-keys-file", str(keys), "--models-refresh-seconds", "0.5", "--http-server", request.param]
    proc = CorralProcess(["router", *args, "--flow-control", "--flow-engine-max-in-flight", "1"])
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(url + "/health")
        yield url
    finally:
        proc.stop()
        sim.stop()


async def flow(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url + "/v1/fleet") as resp:
        section: dict[str, Any] = (await resp.json())["flow"]
        return section


async def until(
    session: aiohttp.ClientSession, url: str, holds: Callable[[dict[str, Any]], bool], what: str
) -> None:
    """Poll /v1/fleet's flow section until `holds`, at most 30 s."""

    async def held() -> bool:
        return holds(await flow(session, url))

    await eventually_awaited(held, what, within=30)


async def test_priority_fairness_shedding_and_every_request_accounted(router: str) -> None:
    finished: list[str] = []

    async def send(session: aiohttp.ClientSession, tenant: str) -> tuple[int, dict[str, str], bytes]:
        headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
        async with session.post(router + "/v1/chat/completions", json=CHAT, headers=headers) as resp:
            body = await resp.read()
            finished.append(tenant)
            return resp.status, dict(resp.headers), body

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        flood = [asyncio.create_task(send(session, "heavy")) for _ in range(FLOOD)]
        await until(
            session, router, lambda f: f["depth"] == FLOOD - 1, "the flood queued (one at the engine)"
        )
        light = asyncio.create_task(send(session, "light"))
        gone = asyncio.create_task(send(session, "heavy"))  # this client hangs up while it waits
        high = asyncio.create_task(send(session, "high"))
        await until(session, router, lambda f: f["depth"] == FLOOD + 2, "light, high and the leaver queued")
        status, headers, body = await send(session, "batch")  # sheddable, while saturated: at once
        assert status == 429 and headers.get("Retry-After", "").isdigit()
        assert orjson.loads(body)["error"]["type"] == "rate_limit_error"
        gone.cancel()
        await until(session, router, lambda f: f["client_gone"] == 1, "the leaver left the queue")
        answers = await asyncio.gather(*flood, light, high)
        section = await flow(session, router)
        async with session.get(router + "/metrics") as resp:
            metrics = await resp.text()

    assert all(status == 200 for status, _, _ in answers)
    order = [t for t in finished if t != "batch"]
    # the one at the engine, then the high band, then the light tenant within the next two of band 0
    assert order.index("high") == 1, order
    assert order.index("light") <= 3, order
    assert order[-FLOOD + 3 :] == ["heavy"] * (FLOOD - 3), order
    # every request accounted for: 14 answered (one went on at once), one shed, one client gone
    assert section["depth"] == 0 and section["oldest_age_seconds"] is None
    assert section["passed"] == 1 and section["dispatched"] == FLOOD + 1  # the leaver never went on
    assert section["client_gone"] == 1 and section["shed"] == {"saturated": 1}
    # /metrics: by band and tenant name, never a key
    assert 'corral_router_flow_dispatched_total{band="10",tenant="high"} 1.0' in metrics
    assert 'corral_router_flow_shed_total{band="-1",reason="saturated",tenant="batch"} 1.0' in metrics
    assert 'corral_router_flow_client_gone_total{band="0",tenant="heavy"} 1.0' in metrics
    assert 'corral_router_flow_wait_seconds_count{band="0",tenant="light"} 1.0' in metrics
    assert not any(key in metrics for key in KEYS.values())


async def test_with_two_workers_a_flood_is_held_to_its_share_of_the_host_slots(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """`--workers 2`: the light tenant holds one of 8 slots, the heavy one floods over connections the
    kernel spreads over both workers. Slot shares count the host's requests of each tenant, so the
    flood holds 4 of the 8 slots whichever worker its requests and the light one's reached (counted by
    each worker alone it took 2, or up to the 7 free ones where the light tenant was not seen)."""
    keys = tmp_path_factory.mktemp("flow-workers") / "keys.yaml"
    keys.write_text(KEYS_FILE)
    os.chmod(keys, 0o600)
    sim, sim_url = start_sim(None, "--max-num-seqs", "8", "--itl-ms", "200", "--ttft-base-ms", "2")
    port = free_port()
    router = f"http://127.0.0.1:{port}"
    args = ["--host", "127.0.0.1", "--port", str(port), "--workers", "2", "--backend", sim_url]
    args += ["--api-keys-file", str(keys), "--flow-control", "--flow-engine-max-in-flight", "8"]
    proc = CorralProcess(["router", *args, "--flow-share-window", "60"])
    started: list[str] = []
    body = {**CHAT, "stream": True, "max_tokens": 200}  # each request holds its slot for ~40 s

    async def hold(session: aiohttp.ClientSession, tenant: str) -> None:
        headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
        async with session.post(router + "/v1/chat/completions", json=body, headers=headers) as resp:
            assert resp.status == 200
            started.append(tenant)
            await resp.content.read()

    async def heavy_waiting(session: aiohttp.ClientSession) -> float:
        async with session.get(router + "/metrics") as resp:  # any worker answers for both
            page = await resp.text()
        return sum(
            s.value
            for s in samples(page, ("corral_router_flow_queue_depth",))
            if s.labels.get("tenant") == "heavy"
        )

    try:
        proc.wait_http(router + "/health")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            light = asyncio.create_task(hold(session, "light"))
            await eventually(lambda: "light" in started, "the light request at the engine", within=30)
            flood = [asyncio.create_task(hold(session, "heavy")) for _ in range(FLOOD)]

            async def placed() -> bool:  # every heavy request at the engine or in a worker's queue
                return started.count("heavy") + await heavy_waiting(session) == FLOOD

            await eventually_awaited(placed, f"the flood placed: {started}", within=30)
            assert started.count("heavy") == 4, (started, proc.output())
            for task in (light, *flood):
                task.cancel()
            await asyncio.gather(light, *flood, return_exceptions=True)
    finally:
        proc.stop()
        sim.stop()
