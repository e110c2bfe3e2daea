"""Slow start end to end: under continuous bounded load through a real `corral router`, an engine that
turns READY — a static `corral sim` added to the backends file, and a supervised sim woken through its
supervisor — takes well under its full share in the first fifth of the ramp and its full share after
it, counted by the engines themselves (`vllm:request_success_total`); with `--slow-start-seconds 0`
it takes its full share at once. The figures are printed (pytest -s)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from corral.router.routing.slow_start import BOOT_SECONDS
from tests.integration.test_supervisor_partial_wake import run_op
from tests.integration.test_supervisor_sleep_ops import DEV
from tests.integration.test_supervisor_support import kill_leftovers, start_supervised
from tests.support.procs import CorralProcess, free_port, start_sim
from tests.support.prom import sample

SECONDS = 5.0  # the ramp
FAST = ("--seed", "0", "--ttft-base-ms", "5", "--itl-ms", "2", "--max-model-len", "256")
WORKERS = 6
FINISHED = "vllm:request_success_total"
WEIGHT = "corral_router_endpoint_warmup_weight"


@dataclass
class Shares:
    first_fifth: float  # the new engine's share of requests in the first fifth of the ramp
    after: float  # ... in the 2.5 s after the ramp
    requests: tuple[int, int]  # requests counted in each window
    full: float  # its full share: 1 / engines
    weight_seen: float | None  # /v1/fleet's slow_start.weight when it turned routable
    gauge_seen: float | None  # corral_router_endpoint_warmup_weight then

    def __str__(self) -> str:
        return (
            f"first fifth {self.first_fifth:.3f} of {self.requests[0]} requests, after the ramp "
            f"{self.after:.3f} of {self.requests[1]}; full share {self.full:.3f}; "
            f"weight when routable {self.weight_seen} (gauge {self.gauge_seen})"
        )


def start_router(*args: str) -> tuple[CorralProcess, str]:
    port = free_port()
    proc = CorralProcess(
        ["router", "--host", "127.0.0.1", "--port", str(port), "--models-refresh-seconds", "0.3", *args]
    )
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/v1/fleet")
    # What the router finds routable in its first BOOT_SECONDS was serving before it started and does
    # not ramp; the engines these tests ramp turn routable after that, as in a running fleet.
    time.sleep(BOOT_SECONDS)
    return proc, url


async def _get_json(s: aiohttp.ClientSession, url: str) -> Any:
    async with s.get(url) as resp:
        return orjson.loads(await resp.read())


async def _finished(s: aiohttp.ClientSession, engine: str) -> float:
    async with s.get(engine + "/metrics") as resp:
        text = (await resp.read()).decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(FINISHED + "{"))


async def _counts(s: aiohttp.ClientSession, engines: list[str]) -> list[float]:
    return list(await asyncio.gather(*(_finished(s, e) for e in engines)))


async def _load(s: aiohttp.ClientSession, router: str, stop: asyncio.Event, failed: list[str]) -> None:
    i = 0
    while not stop.is_set():
        i += 1
        body = {"model": "sim-model", "prompt": f"request {i} {os.getpid()}", "max_tokens": 2}
        async with s.post(router + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                failed.append(f"{resp.status}: {(await resp.read())[:200]!r}")
            await resp.read()


async def _routable(s: aiohttp.ClientSession, router: str, engine: str, within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for e in (await _get_json(s, router + "/v1/fleet"))["endpoints"]:
            if e["url"] == engine and e["routable"]:
                return dict(e)
        await asyncio.sleep(0.02)
    raise AssertionError(f"{engine} not routable through {router} within {within} s")


async def _warm(s: aiohttp.ClientSession, router: str, engines: list[str], within: float) -> None:
    """Wait until the serving engines are past their own ramp (they became routable with the router)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        body = await _get_json(s, router + "/v1/fleet")
        seen = {e["url"]: e for e in body["endpoints"]}
        if all(
            u in seen and seen[u]["routable"] and (seen[u]["slow_start"] or {"weight": 1})["weight"] == 1
            for u in engines
        ):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{engines} not routable and past their ramp within {within} s")


async def _until(wall: float) -> None:
    await asyncio.sleep(max(0.0, wall - time.time()))


async def measure(router: str, engines: list[str], new: str, trigger: Callable[[], None]) -> Shares:
    """Run bounded load, `trigger` the new engine's return, and count each engine's answers in the
    first fifth of the ramp and after it (both measured from when the router made it routable)."""
    stop, failed = asyncio.Event(), []
    k = engines.index(new)
    async with aiohttp.ClientSession() as s:
        workers = [asyncio.create_task(_load(s, router, stop, failed)) for _ in range(WORKERS)]
        try:
            await _warm(s, router, [e for e in engines if e != new], SECONDS + 10)
            await asyncio.to_thread(trigger)
            seen = await _routable(s, router, new, 30)
            ramp = seen["slow_start"]
            since = ramp["since"] if ramp is not None else time.time()
            c0 = await _counts(s, engines)
            async with s.get(router + "/metrics") as resp:
                gauge = sample((await resp.read()).decode(), WEIGHT, endpoint=new)
            await _until(since + SECONDS / 5)
            c1 = await _counts(s, engines)
            await _until(since + SECONDS + 0.2)
            c2 = await _counts(s, engines)
            await _until(since + SECONDS + 2.7)
            c3 = await _counts(s, engines)
        finally:
            stop.set()
            await asyncio.gather(*workers, return_exceptions=True)
    assert not failed, failed[:5]
    early = [b - a for a, b in zip(c0, c1, strict=True)]
    late = [b - a for a, b in zip(c2, c3, strict=True)]
    return Shares(
        first_fifth=early[k] / sum(early),
        after=late[k] / sum(late),
        requests=(int(sum(early)), int(sum(late))),
        full=1 / len(engines),
        weight_seen=ramp["weight"] if ramp is not None else None,
        gauge_seen=gauge,
    )


def _write(path: Path, lines: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


@pytest.mark.parametrize("seconds", [SECONDS, 0.0])
def test_a_backend_added_to_the_backends_file_ramps_up_to_its_share(tmp_path: Path, seconds: float) -> None:
    sims = [start_sim(None, *FAST) for _ in range(3)]
    engines = [url for _, url in sims]
    backends = tmp_path / "backends"
    _write(backends, engines[:2])
    router, url = start_router(
        "--backends-file", str(backends), "--policy", "least_request", "--slow-start-seconds", str(seconds)
    )
    try:
        shares = asyncio.run(measure(url, engines, engines[2], lambda: _write(backends, engines)))
        print(f"\nbackends file, least_request, --slow-start-seconds {seconds}: {shares}")
        assert shares.after > 0.75 * shares.full, shares
        if seconds:
            assert shares.first_fifth < 0.5 * shares.full, shares
            assert shares.weight_seen is not None and shares.weight_seen < 0.3
            assert shares.gauge_seen is not None and shares.gauge_seen < 0.5
        else:
            assert shares.weight_seen is None and shares.gauge_seen is None  # off: neither shown
            assert shares.first_fifth > 0.75 * shares.full, shares
    finally:
        router.stop()
        for proc, _ in sims:
            proc.stop()


def test_a_woken_engine_ramps_up_to_its_share() -> None:
    sim_args = ("--enable-sleep-mode", "--weights-gib", "2", "--kv-cache-gib", "4", *FAST)
    sup = start_supervised(sim_args=sim_args, sup_args=("--quiet-period", "0.2"), env=DEV)
    sims = [start_sim(None, *FAST) for _ in range(2)]
    engines = [sup.engine_url, *(u for _, u in sims)]
    router: CorralProcess | None = None
    try:
        sup.wait_state("READY", 30)
        router, url = start_router(
            *("--supervised", f"{sup.engine_url}={sup.url}", "--supervisor-heartbeat", "0.5"),
            *("--backend", engines[1], "--backend", engines[2]),
            *("--policy", "round_robin", "--slow-start-seconds", str(SECONDS)),
        )

        async def asleep() -> None:
            async with aiohttp.ClientSession() as s:
                await _routable(s, url, engines[0], 20)

        asyncio.run(asleep())
        assert run_op(sup, "/v1/sleep", {"level": 1, "mode": "wait", "operation_id": "s1"})["status"] == (
            "succeeded"
        )

        def wake() -> None:
            assert run_op(sup, "/v1/wake", {"operation_id": "w1"})["status"] == "succeeded"

        shares = asyncio.run(measure(url, engines, engines[0], wake))
        print(f"\nwoken engine, round_robin, --slow-start-seconds {SECONDS}: {shares}")
        assert shares.first_fifth < 0.5 * shares.full, shares
        assert shares.after > 0.75 * shares.full, shares
    finally:
        if router is not None:
            router.stop()
        for proc, _ in sims:
            proc.stop()
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)


def test_a_newcomer_inside_the_routers_own_first_ramp_is_still_capped(tmp_path: Path) -> None:
    """Issue 28's case: a router started 4 s before engine B was added to its backends file (a 10 s
    ramp, round robin). The endpoint present at start does not ramp against B, and B's cap holds:
    before, both were over their caps and the fallback offered both, so B took half the requests."""
    ramp = 10.0
    sims = [start_sim(None, *FAST) for _ in range(2)]
    engines = [url for _, url in sims]
    backends = tmp_path / "backends"
    _write(backends, engines[:1])
    port = free_port()
    router = CorralProcess(
        [
            *("router", "--host", "127.0.0.1", "--port", str(port), "--models-refresh-seconds", "0.3"),
            *("--backends-file", str(backends), "--policy", "round_robin", "--slow-start-seconds", str(ramp)),
        ]
    )
    url = f"http://127.0.0.1:{port}"
    stop, failed = asyncio.Event(), []

    async def run() -> tuple[float, int]:
        async with aiohttp.ClientSession() as s:
            workers = [asyncio.create_task(_load(s, url, stop, failed)) for _ in range(WORKERS)]
            try:
                await _until(started + 4.0)
                await asyncio.to_thread(_write, backends, engines)
                seen = await _routable(s, url, engines[1], 30)
                since = seen["slow_start"]["since"]
                c0 = await _counts(s, engines)
                await _until(since + 2.0)
                c1 = await _counts(s, engines)
            finally:
                stop.set()
                await asyncio.gather(*workers, return_exceptions=True)
        got = [b - a for a, b in zip(c0, c1, strict=True)]
        return got[1] / sum(got), int(sum(got))

    try:
        router.wait_http(url + "/v1/fleet")
        started = time.time()
        share, requests = asyncio.run(run())
        print(f"\nnewcomer 4 s after the router's start, round_robin, 10 s ramp: {share:.3f} of {requests}")
        assert not failed, failed[:5]
        assert requests > 50
        # B's weight over its first 2 s averages 0.19: at most ~0.1 of two engines' requests
        assert share < 0.25
    finally:
        router.stop()
        for proc, _ in sims:
            proc.stop()
