"""Drain under continuous load through `corral router` (static membership, two supervised engines):
SIGTERM to one supervisor loses no request that had not started streaming, lets every in-flight
stream complete (policy wait), and the engine is gone before the grace period ends.

The router learns of the drain only through its own failure handling here (the state stream comes
with the discovery issue): the quiet period cannot be reached while it still sends, so the drain goes
on at the propagation deadline, waits for in-flight requests, and SIGTERMs the engine, which stops
accepting; the router's retry before the first byte carries the rest to the other engine.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass, field

import aiohttp

from tests.integration.test_supervisor_support import gone, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess, free_port
from tests.support.streams import stream_once
from tests.support.waits import eventually

GRACE_S = 30.0
SIM_ARGS = ("--itl-ms", "20", "--shutdown-timeout", "8")
DRAIN_ARGS = (
    "--propagation-timeout",
    "2",
    "--quiet-period",
    "0.5",
    "--drain-timeout",
    "10",
    "--shutdown-timeout",
    "10",
)


@dataclass
class Outcomes:
    completed: int = 0
    failed_before_stream: list[str] = field(default_factory=list)
    broken_streams: list[str] = field(default_factory=list)


async def one_stream(session: aiohttp.ClientSession, url: str, out: Outcomes) -> None:
    body = {"model": "sim-model", "prompt": "tell me about draining", "max_tokens": 16, "stream": True}
    outcome = await stream_once(session, url + "/v1/completions", body)
    if outcome.kind == "completed":
        out.completed += 1
    elif outcome.kind == "failed_before_stream":
        out.failed_before_stream.append(outcome.detail)
    else:
        out.broken_streams.append(outcome.detail)


async def load(url: str, out: Outcomes, stop: asyncio.Event, workers: int = 6) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def worker() -> None:
            while not stop.is_set():
                await one_stream(session, url, out)

        await asyncio.gather(*(worker() for _ in range(workers)))


async def test_sigterm_under_load_through_the_router_loses_nothing() -> None:
    sups = [start_supervised(sim_args=SIM_ARGS, sup_args=DRAIN_ARGS) for _ in range(2)]
    router_port = free_port()
    router: CorralProcess | None = None
    try:
        for sup in sups:
            await asyncio.to_thread(sup.wait_state, "READY", 30)
        backends = [arg for sup in sups for arg in ("--backend", sup.engine_url)]
        router = CorralProcess(
            [
                "router",
                "--host",
                "127.0.0.1",
                "--port",
                str(router_port),
                "--policy",
                "round_robin",
                *backends,
            ]
        )
        router_url = f"http://127.0.0.1:{router_port}"
        await asyncio.to_thread(router.wait_http, router_url + "/health")
        victim = sups[0]
        engine_pid = victim.state()["engine"]["pid"]
        assert engine_pid

        out, stop = Outcomes(), asyncio.Event()
        load_task = asyncio.create_task(load(router_url, out, stop))
        await eventually(lambda: out.completed >= 12, "two answers per load worker", within=60)
        assert out.completed > 0 and not out.failed_before_stream, out
        before = out.completed
        victim.proc.proc.send_signal(signal.SIGTERM)  # as the kubelet does: to the supervisor only
        sigterm_at = time.monotonic()
        code = await asyncio.to_thread(victim.proc.wait_exit, GRACE_S)
        exited_after = time.monotonic() - sigterm_at
        engine_gone = gone(engine_pid)
        at_exit = out.completed
        # load goes on against the survivor: answers completed after the victim exited
        await eventually(lambda: out.completed >= at_exit + 12, "answers from the survivor", within=60)
        stop.set()
        await asyncio.wait_for(load_task, 60)

        assert code == 0, victim.proc.output()[-4000:]
        assert exited_after < GRACE_S and engine_gone
        assert out.failed_before_stream == [], out.failed_before_stream[:5]
        assert out.broken_streams == [], out.broken_streams[:5]
        assert out.completed > before

        moves = [(t["to"], t["sub_state"]) for t in victim.transitions()]
        i = moves.index(("DRAINING", "leaving_routing"))
        assert moves[i:] == [
            ("DRAINING", "leaving_routing"),
            ("DRAINING", "waiting_in_flight"),
            ("STOPPING", "stopping_engine"),
            ("STOPPING", "engine_stopped"),
        ]
        report = victim.transitions()[-1]["evidence"]
        assert report["policy"] == "wait" and report["at_stop"] is not None
        # static membership: the router keeps sending until the engine refuses connections, so the
        # quiet period is usually not reached and in-flight work rarely touches zero; what the
        # engine still had at SIGTERM was left to its own --shutdown-timeout drain (no stream broke)
        shutdown = [r for r in victim.oplog() if r["record"] == "operation" and r["status"] == "succeeded"]
        assert shutdown and shutdown[0]["kind"] == "shutdown"
    finally:
        if router is not None:
            router.stop()
        for sup in sups:
            pids = sup.engine_pids()
            sup.proc.stop(grace=20)
            kill_leftovers(pids)
