"""A frozen engine under load through a router (issue 30): two `corral sim` engines, each under its
supervisor, behind one `corral router` following their state streams; a few clients send whole
(non-streamed) completions; one engine's process is frozen with SIGSTOP, as a GPU hang, a wedged driver
call or a stuck collective looks from outside, then resumed.

- Its supervisor's `/readyz` is 503 within 15 s (DRAINING/not_answering, with the probes as evidence)
  and the router acknowledges that epoch.
- The requests in flight at the freeze are answered within 10 s: the router abandons what is out to the
  engine it judged failed (their connections closed) and retries each on the other engine; no client
  request fails.
- SIGCONT: the same engine process earns READY again (the smoke request) and the router routes to it
  again, on its slow-start ramp.

Bounds are `wait_until`-style deadlines from the freeze, never assertions on a measured duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.integration.test_supervisor_support import Supervised, http_json, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess, free_port

ENGINE_ARGS = ("--itl-ms", "20")
CLIENTS = 4
READYZ_BOUND = 15.0  # from the freeze to the frozen engine's /readyz 503
IN_FLIGHT_BOUND = 10.0  # from the freeze to every request then in flight answered
BODY = {"model": "sim-model", "prompt": "a frozen engine", "max_tokens": 16, "stream": False}


@dataclass
class Call:
    started: float  # time.monotonic()
    ended: float | None = None
    status: int | None = None
    error: str | None = None


@dataclass
class Load:
    calls: list[Call] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def in_flight_at(self, at: float) -> list[Call]:
        return [c for c in self.calls if c.started <= at and (c.ended is None or c.ended > at)]

    def failed(self) -> list[Call]:
        return [c for c in self.calls if c.ended is not None and c.status != 200]


async def clients(router_url: str, load: Load) -> None:
    # the client's own timeout is far past every bound: a request it cuts is a failure, not a pass
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session:

        async def client() -> None:
            while not load.stop.is_set():
                call = Call(time.monotonic())
                load.calls.append(call)
                try:
                    async with session.post(router_url + "/v1/completions", json=BODY) as resp:
                        await resp.read()
                        call.status = resp.status
                except (aiohttp.ClientError, TimeoutError) as exc:
                    call.error = f"{type(exc).__name__}: {exc}"
                call.ended = time.monotonic()

        await asyncio.gather(*(client() for _ in range(CLIENTS)))


def start_router(sups: list[Supervised]) -> tuple[CorralProcess, str]:
    port = free_port()
    pairs = [arg for sup in sups for arg in ("--supervised", f"{sup.engine_url}={sup.url}")]
    proc = CorralProcess(
        [
            "router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--router-id",
            "router-frozen",
            "--supervisor-heartbeat",
            "0.5",
            "--policy",
            "round_robin",
            "--slow-start-seconds",
            "5",
            "--workers",
            "1",
            *pairs,
        ]
    )
    return proc, f"http://127.0.0.1:{port}"


def endpoint(router_url: str, engine_url: str) -> dict[str, Any]:
    (found,) = [e for e in http_json(router_url + "/v1/fleet")[1]["endpoints"] if e["url"] == engine_url]
    return dict(found)


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def sample(text: str, series: str) -> float:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series + " ")]
    return values[0] if values else 0.0


async def until(check: Any, deadline: float, what: str, detail: Any = None) -> None:
    """Poll `check` (run in a thread) until it holds or time.monotonic() passes `deadline`; `detail()`
    says what was seen, for the failure."""
    while True:
        if await asyncio.to_thread(check):
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"not {what} by the deadline" + (f": {detail()}" if detail else ""))
        await asyncio.sleep(0.1)


async def routing_to(sups: list[Supervised]) -> tuple[CorralProcess, str]:
    """The supervised engines READY, a router in front of them, and every one routable through it (the
    router is stopped again when that does not come)."""
    for sup in sups:
        await asyncio.to_thread(sup.wait_state, "READY", 60)
    proc, router_url = start_router(sups)
    try:
        await asyncio.to_thread(proc.wait_http, router_url + "/health", 30)
        await until(
            lambda: all(endpoint(router_url, s.engine_url)["routable"] for s in sups),
            time.monotonic() + 30,
            "every engine routable",
        )
    except BaseException:
        proc.stop()
        raise
    return proc, router_url


async def test_a_frozen_engine_leaves_routing_its_requests_go_elsewhere_and_it_earns_its_way_back() -> None:
    sups = [start_supervised(sim_args=(*ENGINE_ARGS, "--seed", str(i))) for i in range(2)]
    router: tuple[CorralProcess, str] | None = None
    frozen: int | None = None
    load = Load()
    load_task: asyncio.Task[None] | None = None
    try:
        router = await routing_to(sups)
        proc, router_url = router
        victim = sups[0]
        load_task = asyncio.create_task(clients(router_url, load))
        await until(
            lambda: len([c for c in load.calls if c.status == 200]) >= 20, time.monotonic() + 60, "load"
        )
        assert not load.failed(), load.failed()[:3]

        frozen = victim.engine_pids()[-1]
        os.killpg(frozen, signal.SIGSTOP)
        frozen_at = time.monotonic()
        at_freeze = load.in_flight_at(frozen_at)
        assert at_freeze, "no request was in flight at the freeze: the check proves nothing"

        await until(lambda: victim.probe("/readyz")[0] == 503, frozen_at + READYZ_BOUND, "/readyz 503")
        await until(
            lambda: all(c.ended is not None for c in at_freeze),
            frozen_at + IN_FLIGHT_BOUND,
            "the requests in flight at the freeze answered",
            lambda: (
                [
                    (round(c.started - frozen_at, 2), c.ended and round(c.ended - frozen_at, 2))
                    for c in at_freeze
                ],
                victim.state().get("sub_state"),
                proc.output()[-4000:],
            ),
        )
        assert all(c.status == 200 for c in at_freeze), [(c.status, c.error) for c in at_freeze]

        state = await asyncio.to_thread(victim.state)
        assert (state["state"], state["sub_state"]) == ("DRAINING", "not_answering"), state
        assert state["evidence"]["probes_timed_out"] >= 1, state["evidence"]
        withdrawal = state["epoch"]
        await until(
            lambda: (
                (victim.state()["routers"]["acks"].get("router-frozen") or {}).get("epoch", 0) >= withdrawal
            ),
            time.monotonic() + 15,
            "the router's acknowledgement of the withdrawal",
        )
        seen = endpoint(router_url, victim.engine_url)
        assert not seen["routable"] and seen["supervisor"]["sub_state"] == "not_answering", seen
        text = await asyncio.to_thread(metrics_text, router_url)
        assert sample(text, 'corral_router_abandoned_requests_total{outcome="retried"}') >= 1, text
        assert sample(text, 'corral_router_abandoned_requests_total{outcome="not_retried"}') == 0
        # what a change record reads before and after an operation (request_failures)
        assert http_json(router_url + "/v1/fleet")[1]["totals"]["abandoned"] >= 1

        sent_before = seen["requests_sent"]
        os.killpg(frozen, signal.SIGCONT)
        frozen = None
        body = await asyncio.to_thread(victim.wait_state, "READY", 60)
        assert "smoke completion answered" in body["reason"] and body["restarts"] == [], body
        assert len(victim.engine_pids()) == 1  # the same engine process, not a restart
        await until(
            lambda: endpoint(router_url, victim.engine_url)["requests_sent"] > sent_before + 3,
            time.monotonic() + 60,
            "requests routed to the resumed engine",
        )
        back = endpoint(router_url, victim.engine_url)
        assert back["routable"] and back["slow_start"] is not None, back

        load.stop.set()
        await asyncio.wait_for(load_task, 120)
        load_task = None
        assert load.calls and not load.failed(), [(c.status, c.error) for c in load.failed()][:5]
        assert all(c.ended is not None for c in load.calls)
        print(f"\n{len(load.calls)} requests, {len(at_freeze)} in flight at the freeze, none failed")
    finally:
        load.stop.set()
        if frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(frozen, signal.SIGCONT)
        if load_task is not None:
            load_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await load_task
        if router is not None:
            router[0].stop()
        for sup in sups:
            pids = sup.engine_pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGCONT)
            sup.proc.stop(grace=20)
            kill_leftovers(pids)
