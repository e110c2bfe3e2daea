"""A runbook wake confirms the routers re-added the engine: a real `corral router` following the
supervisor's state stream acknowledges the READY epoch of the wake once the engine is back in its
routing table, and the wake's POSTCHECK evidence (in the operation's change record) names it; a
subscriber that never acknowledges is named missing at the propagation bound, and the wake still
succeeds (the engine serves; a restart would cut the routers that did re-add it)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from tests.integration.test_supervisor_confirmed_drain import fleet, start_router
from tests.integration.test_supervisor_partial_wake import run_op
from tests.integration.test_supervisor_sleep_ops import DEV
from tests.integration.test_supervisor_support import Supervised, kill_leftovers, start_supervised
from tests.support.waits import wait_until

SIM_ARGS = ("--enable-sleep-mode", "--weights-gib", "2", "--kv-cache-gib", "4", "--itl-ms", "5")
SUP_ARGS = ("--propagation-timeout", "3", "--quiet-period", "0.2")


def routable(router_url: str, engine_url: str) -> bool:
    return any(e["url"] == engine_url and e["routable"] for e in fleet(router_url)["endpoints"])


def postcheck_routing(op: dict[str, Any]) -> dict[str, Any]:
    """The wake's POSTCHECK evidence as its change record carries it."""
    steps = op["result"]["change_record"]["steps"]
    (post,) = [s for s in steps if s["step"] == "postcheck"]
    routing: dict[str, Any] = post["data"]["routing"]
    return routing


def ready_epoch(sup: Supervised) -> int:
    ready = [r for r in sup.oplog() if r["record"] == "transition" and r["state"] == "READY"]
    epoch: int = ready[-1]["epoch"]
    return epoch


def sleep_and_wake(sup: Supervised, n: int) -> dict[str, Any]:
    sleep = run_op(sup, "/v1/sleep", {"level": 1, "mode": "wait", "operation_id": f"s{n}"})
    assert sleep["status"] == "succeeded", sleep
    wake = run_op(sup, "/v1/wake", {"operation_id": f"w{n}"})
    assert wake["status"] == "succeeded", wake
    return wake


async def test_a_wake_waits_for_the_router_to_route_to_the_engine_again_and_names_a_silent_one() -> None:
    sup = start_supervised(sim_args=SIM_ARGS, sup_args=SUP_ARGS, env=DEV)
    router = None
    try:
        await asyncio.to_thread(sup.wait_state, "READY", 30)
        router, router_url = start_router("wake-router", [sup])
        await asyncio.to_thread(router.wait_http, router_url + "/v1/fleet")
        await asyncio.to_thread(
            wait_until, lambda: routable(router_url, sup.engine_url), 30, "the engine routable at first"
        )

        wake = await asyncio.to_thread(sleep_and_wake, sup, 1)
        routing = postcheck_routing(wake)
        assert routing["ready_epoch"] == ready_epoch(sup), routing
        assert [r["router_id"] for r in routing["routers_readded"]] == ["wake-router"], routing
        assert routing["routers_missing"] == [] and routing["routers_gone"] == [], routing
        # the acknowledgement came after the router had the engine back: no wait needed to see it
        assert routable(router_url, sup.engine_url), fleet(router_url)
        acks = [r for r in sup.oplog() if r["record"] == "ack" and r["epoch"] == routing["ready_epoch"]]
        assert [(a["router_id"], a["state"]) for a in acks] == [("wake-router", "READY")], acks

        # a subscriber that never acknowledges: named missing at the bound, the wake still succeeds
        async with aiohttp.ClientSession() as session:
            params = {"router_id": "silent-router", "heartbeat": "0.2"}
            async with session.get(sup.url + "/v1/state/watch", params=params) as held:
                assert held.status == 200
                assert orjson.loads(await held.content.readline())["state"] == "READY"
                wake = await asyncio.to_thread(sleep_and_wake, sup, 2)
        routing = postcheck_routing(wake)
        assert routing["routers_missing"] == ["silent-router"], routing
        assert [r["router_id"] for r in routing["routers_readded"]] == ["wake-router"], routing
        assert routing["seconds"] >= 3.0, routing  # held to the bound, by the supervisor's own clock
    finally:
        if router is not None:
            router.stop()
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)
