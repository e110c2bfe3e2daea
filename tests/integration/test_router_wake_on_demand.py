"""Scale from zero by wake on demand: with every engine of the model SLEEPING, a burst of 50 concurrent
requests through a router with `--wake-hold-seconds` triggers one wake at the supervisor (however many
requests and routers ask), and every request is held until the engine is READY again and then
answered; a router whose hold is too short answers 503 with Retry-After; one with `--wake-mode reject`
answers 503 with Retry-After at once and still asks for the wake; each router's /metrics counts its
wakes, held requests and how each hold ended. Real processes: a supervised `corral sim` in dev mode
and three routers."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.integration.test_supervisor_confirmed_drain import wait_until
from tests.integration.test_supervisor_support import Supervised, http_json, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess, free_port
from tests.support.prom import sample, scrape
from tests.support.streams import stream_once

DEV = {"VLLM_SERVER_DEV_MODE": "1"}
SIM_ARGS = ("--enable-sleep-mode", "--itl-ms", "5")
BODY = {"model": "sim-model", "prompt": "wake up", "max_tokens": 6, "stream": True}
BURST = 50


def start_router(
    name: str, sup: Supervised, hold: str, *extra: str, answering: str = "/health"
) -> tuple[CorralProcess, str]:
    """A router following `sup`, once `answering` answers 200 (/v1/fleet: whether or not an engine is
    routable)."""
    port = free_port()
    proc = CorralProcess(
        [
            "router",
            "--port",
            str(port),
            "--router-id",
            name,
            "--supervisor-heartbeat",
            "0.5",
            "--wake-hold-seconds",
            hold,
            "--supervised",
            f"{sup.engine_url}={sup.url}",
            *extra,
        ]
    )
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + answering)
    return proc, url


def routable(router_url: str) -> bool:
    endpoints = http_json(router_url + "/v1/fleet")[1]["endpoints"]
    return len(endpoints) == 1 and endpoints[0]["routable"]


def wakes(sup: Supervised) -> list[dict[str, Any]]:
    return [o for o in sup.state()["operations"] if o["kind"] == "wake"]


def wake_counts(router_url: str) -> dict[str, float | None]:
    text = scrape(router_url + "/metrics")
    model = {"model": "sim-model"}
    return {
        "wakes": sample(text, "corral_router_wakes_total", **model),
        "held": sample(text, "corral_router_wake_held_requests_total", **model),
        "served": sample(text, "corral_router_wake_hold_outcomes_total", outcome="served", **model),
        "timed_out": sample(text, "corral_router_wake_hold_outcomes_total", outcome="timed_out", **model),
    }


def sleep(sup: Supervised) -> None:
    status, op = http_json(sup.url + "/v1/sleep", "POST", {"level": 1})
    assert status == 202, op
    sup.wait_state("SLEEPING", 30)


async def asleep_answers_503(sup: Supervised, router_url: str) -> None:
    """Once the engine is routable through `router_url`, put it to sleep; a request then gets 503 with
    Retry-After."""
    await wait_until(lambda: routable(router_url), 10, f"endpoint routable again via {router_url}")
    await asyncio.to_thread(sleep, sup)
    await wait_until(lambda: not routable(router_url), 10, f"endpoint out of routing via {router_url}")
    async with (
        aiohttp.ClientSession() as session,
        session.post(router_url + "/v1/completions", json={**BODY, "stream": False}) as resp,
    ):
        assert resp.status == 503, await resp.text()
        assert int(resp.headers["Retry-After"]) >= 1


async def test_requests_for_a_sleeping_model_wake_it_once_and_are_held() -> None:
    sup = start_supervised(sim_args=SIM_ARGS, sup_args=("--quiet-period", "0.3"), env=DEV)
    routers: list[CorralProcess] = []
    try:
        await asyncio.to_thread(sup.wait_state, "READY", 30)
        holding, holding_url = start_router("holding", sup, "20", "--wake-hold-max", str(BURST))
        impatient, impatient_url = start_router("impatient", sup, "0.01")
        rejecting, rejecting_url = start_router("rejecting", sup, "20", "--wake-mode", "reject")
        routers = [holding, impatient, rejecting]
        for url in (holding_url, impatient_url, rejecting_url):
            await wait_until(lambda url=url: routable(url), 15, f"endpoint routable via {url}")

        await asyncio.to_thread(sleep, sup)
        for url in (holding_url, impatient_url):
            await wait_until(lambda url=url: not routable(url), 10, f"endpoint out of routing via {url}")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            outcomes = await asyncio.gather(
                *(stream_once(session, holding_url + "/v1/completions", BODY) for _ in range(BURST))
            )
        assert [o.kind for o in outcomes] == ["completed"] * BURST, [o.detail for o in outcomes]
        # fifty held requests, one wake; it serves once routable again and finishes with its POSTCHECK,
        # which may still be running when the held requests have been answered
        await wait_until(
            lambda: [w["status"] for w in wakes(sup)] != ["running"], 15, "the wake finished its POSTCHECK"
        )
        (wake,) = wakes(sup)
        assert wake["operation_id"].startswith("wake-on-demand-") and wake["status"] == "succeeded", wake
        assert sup.state()["state"] == "READY"
        assert wake_counts(holding_url) == {"wakes": 1, "held": BURST, "served": BURST, "timed_out": None}
        assert sample(scrape(holding_url + "/metrics"), "corral_router_errors_total") == 0

        await asleep_answers_503(sup, impatient_url)
        # the short hold still asked for the wake: the engine comes back for the next request
        await asyncio.to_thread(sup.wait_state, "READY", 30)
        assert len(wakes(sup)) == 2
        assert wake_counts(impatient_url) == {"wakes": 1, "held": 1, "served": None, "timed_out": 1}

        # --wake-mode reject: 503 with Retry-After at once, the wake still asked for
        await asleep_answers_503(sup, rejecting_url)
        await asyncio.to_thread(sup.wait_state, "READY", 30)
        assert len(wakes(sup)) == 3
        rejected = scrape(rejecting_url + "/metrics")
        assert sample(rejected, "corral_router_wakes_total", model="sim-model") == 1
        assert (
            sample(rejected, "corral_router_no_engine_answers_total", model="sim-model", why="mode_reject")
            == 1
        )
        assert sample(rejected, "corral_router_wake_held_requests_total", model="sim-model") is None
    finally:
        for proc in routers:
            proc.stop()
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)
