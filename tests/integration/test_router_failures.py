"""Engines failing under `corral router`, with real processes on loopback: a SIGKILLed engine under
concurrent load, a hung engine, a listener that never answers, a client that hangs up."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections import Counter
from collections.abc import Iterator

import aiohttp
import orjson
import pytest

from tests.integration.test_router_passthrough import SIM_ARGS, fleet_state, post, start_router
from tests.support.procs import start_sim

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}


async def one_request(s: aiohttp.ClientSession, url: str, stream: bool, i: int) -> str:
    """'ok', 'cut' (bytes had reached the client, then the stream ended with an error event), or
    'failed' (the request failed before any byte reached the client)."""
    got_bytes = False
    try:
        async with s.post(
            url + "/v1/chat/completions",
            data=orjson.dumps({**CHAT, "stream": stream}),
            headers={"X-Request-Id": f"load-{i}"},
        ) as resp:
            if resp.status != 200:
                return f"failed:{resp.status}"
            body = b""
            async for chunk in resp.content.iter_any():
                got_bytes = True
                body += chunk
    except aiohttp.ClientError as exc:
        return "cut" if got_bytes else f"failed:{type(exc).__name__}"
    if stream:
        if b'data: {"error"' in body:
            return "cut"
        return "ok" if body.endswith(b"data: [DONE]\n\n") else "cut"
    return "ok" if orjson.loads(body)["choices"] else "failed:empty"


async def test_sigkilled_engine_under_load_fails_no_request_that_had_not_started() -> None:
    fast = ("--seed", "0", "--ttft-base-ms", "20", "--itl-ms", "5")
    sims = [start_sim(None, *fast) for _ in range(3)]
    router, url = start_router(
        *(u for _, u in sims),
        extra=("--policy", "least_request", "--max-retries", "2", "--eject-seconds", "5"),
    )
    victim = sims[0][0]
    results: list[str] = []
    total, workers = 360, 24
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            counter = iter(range(total))

            async def worker() -> None:
                for i in counter:
                    if i == total // 3:
                        victim.signal(signal.SIGKILL)
                    results.append(await one_request(s, url, stream=i % 2 == 0, i=i))

            await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(workers))), timeout=120)
        outcome = Counter(results)
        failed = [r for r in results if r.startswith("failed")]
        assert len(results) == total
        assert failed == [], outcome
        assert outcome["ok"] >= total - workers  # only streams open at the kill can be cut
        state = {e["url"]: e for e in fleet_state(url)}
        assert state[sims[0][1]]["routable"] is False
        metrics = metric_values(url)
        print(outcome, metrics)
        assert metrics["corral_router_ejections_total"] >= 1
    finally:
        router.stop()
        for p, _ in sims:
            p.stop()


async def test_hung_engine_does_not_stall_requests_to_the_other() -> None:
    healthy, healthy_url = start_sim(None, *SIM_ARGS)
    hung, hung_url = start_sim(None, *SIM_ARGS, "--hang-after", "0")
    router, url = start_router(
        healthy_url,
        hung_url,
        extra=("--policy", "round_robin", "--request-timeout", "1", "--eject-seconds", "30"),
    )
    try:
        async with aiohttp.ClientSession() as s:
            started = time.monotonic()
            results = await asyncio.wait_for(
                asyncio.gather(*(one_request(s, url, stream=i % 2 == 0, i=i) for i in range(8))), timeout=30
            )
            assert results == ["ok"] * 8
            # Once ejected, the hung engine costs nothing: these never wait for a timeout.
            for i in range(6):
                assert await one_request(s, url, stream=False, i=100 + i) == "ok"
            assert time.monotonic() - started < 30
        state = {e["url"]: e for e in fleet_state(url)}
        assert state[hung_url]["routable"] is False and state[hung_url]["ejected_until"] is not None
        assert state[healthy_url]["routable"] is True
    finally:
        router.stop()
        healthy.stop()
        hung.stop()


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A TCP port that accepts connections and never says a word."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


async def test_silent_listener_never_becomes_routable_and_stalls_nothing(silent_listener: str) -> None:
    sim, sim_url = start_sim(None, *SIM_ARGS)
    router, url = start_router(sim_url, silent_listener, extra=("--request-timeout", "1"), wait_ready=1)
    try:
        async with aiohttp.ClientSession() as s:
            results = await asyncio.wait_for(
                asyncio.gather(*(one_request(s, url, stream=True, i=i) for i in range(10))), timeout=20
            )
        assert results == ["ok"] * 10
        deadline = time.monotonic() + 10
        while (
            "timed out"
            not in (listener := {e["url"]: e for e in fleet_state(url)}[silent_listener])["reason"]
        ):
            assert time.monotonic() < deadline, listener
            await asyncio.sleep(0.1)
        assert listener["state"] == "STARTING" and listener["routable"] is False
    finally:
        router.stop()
        sim.stop()


def metric_values(url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=2.0) as resp:
        text = resp.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def engine_running(sim_url: str) -> float:
    import urllib.request

    with urllib.request.urlopen(sim_url + "/metrics", timeout=2.0) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running")
    )


async def test_client_hanging_up_aborts_the_engine_request() -> None:
    sim, sim_url = start_sim(None, "--seed", "0", "--itl-ms", "20", "--max-model-len", "4096")
    router, url = start_router(sim_url)
    try:
        long = {**CHAT, "max_tokens": 2000, "stream": True}
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/chat/completions", data=orjson.dumps(long)) as resp:
                assert resp.status == 200
                await resp.content.readany()
                assert engine_running(sim_url) == 1
                resp.close()
        deadline = time.monotonic() + 10
        while engine_running(sim_url) != 0:
            assert time.monotonic() < deadline, "engine still generating for a client that left"
            await asyncio.sleep(0.1)
        assert fleet_state(url)[0]["in_flight"] == 0
    finally:
        router.stop()
        sim.stop()


async def test_router_stops_cleanly_on_sigterm() -> None:
    sim, sim_url = start_sim(None, *SIM_ARGS)
    router, url = start_router(sim_url)
    try:
        async with aiohttp.ClientSession() as s:
            status, _, _ = await post(s, url + "/v1/chat/completions", CHAT)
            assert status == 200
        router.signal(signal.SIGTERM)
        assert router.wait_exit(15) == 0
        # the printed line is the contract: it tells the person where to connect
        assert "corral router ready on" in router.output()
    finally:
        router.stop()
        sim.stop()
