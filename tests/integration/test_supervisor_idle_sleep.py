"""Idle sleep end to end: two supervised `corral sim` engines of one model, each with
`--sleep-after-seconds 1` and the other as its `--sleep-peer`. With no traffic, one of them (the second
by engine URL) goes to sleep through the runbook's sleep (PRECHECK, drain, VERIFY, POSTCHECK), its
change recorded with the reason; the other stays awake as the model's last awake engine, and says so.
A request through a router that follows the sleeper wakes it (wake on demand) and is served. A third,
alone with `--sleep-last-awake`, sleeps as well; a fourth without sleep mode is refused by PRECHECK
once, stays READY and says when it tries again. Real processes on loopback."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp

from tests.integration.test_router_wake_on_demand import BODY, start_router, wakes
from tests.integration.test_supervisor_confirmed_drain import wait_until
from tests.integration.test_supervisor_support import Supervised, http_json, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess, free_port
from tests.support.streams import stream_once

DEV = {"VLLM_SERVER_DEV_MODE": "1"}
SIM_ARGS = ("--enable-sleep-mode", "--itl-ms", "5")
IDLE = ("--sleep-after-seconds", "1", "--quiet-period", "0.3")


def asleep_via(router_url: str) -> bool:
    endpoints = http_json(router_url + "/v1/fleet")[1]["endpoints"]
    return len(endpoints) == 1 and (endpoints[0].get("supervisor") or {}).get("state") == "SLEEPING"


def idle_sleeps(sup: Supervised) -> list[dict[str, Any]]:
    ops = sup.state()["operations"]
    return [o for o in ops if o["kind"] == "sleep" and o["operation_id"].startswith("idle-sleep-")]


async def test_an_idle_engine_sleeps_through_the_runbook_but_never_the_last_awake_one() -> None:
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    sups: list[Supervised] = []
    router: CorralProcess | None = None
    try:
        for i in (0, 1):
            peer = ("--sleep-peer", urls[1 - i])
            sups.append(start_supervised(sim_args=SIM_ARGS, sup_args=(*IDLE, *peer), port=ports[i], env=DEV))
        sups.append(start_supervised(sim_args=SIM_ARGS, sup_args=(*IDLE, "--sleep-last-awake"), env=DEV))
        # an engine without sleep mode: PRECHECK refuses, once, and the next try backs off
        sups.append(
            start_supervised(sim_args=("--itl-ms", "5"), sup_args=(*IDLE, "--sleep-last-awake"), env=DEV)
        )
        alone, refusing = sups[2], sups[3]
        # exactly one of the pair sleeps: the rule keeps one awake (which one depends on which of them finds
        # the other idle first, the first by engine URL when both are idle at once)
        pair = sups[:2]
        await wait_until(
            lambda: sum(s.state()["state"] == "SLEEPING" for s in pair) == 1, 60, "one of the pair asleep"
        )
        sleeper, keeper = sorted(pair, key=lambda s: s.state()["state"] != "SLEEPING")
        await asyncio.to_thread(alone.wait_state, "SLEEPING", 60)
        (op,) = idle_sleeps(sleeper)
        await wait_until(
            lambda: idle_sleeps(sleeper)[0]["status"] == "succeeded", 15, "the idle sleep's POSTCHECK"
        )
        steps = [step["step"] for step in idle_sleeps(sleeper)[0]["result"]["steps"]]
        assert {"precheck", "verify", "postcheck"} <= set(steps), steps
        state = sleeper.state()
        assert state["sleep"]["reason"] == "idle 1 s" and state["sleep"]["level"] == 1, state["sleep"]
        (record,) = [r for r in sleeper.oplog() if r.get("record") == "idle_sleep"]
        assert record["reason"] == "idle 1 s" and record["operation_id"] == op["operation_id"]
        assert alone.state()["sleep"]["reason"] == "idle 1 s"

        # the keeper is idle too, and stays awake as the model's last awake engine
        await wait_until(
            lambda: (keeper.state()["idle_sleep"] or {}).get("held_awake") is not None,
            15,
            "the keeper held awake",
        )
        kept = keeper.state()
        assert kept["state"] == "READY" and kept["sleep"] is None and not idle_sleeps(keeper)
        assert "last awake engine of sim-model" in kept["idle_sleep"]["held_awake"], kept["idle_sleep"]

        await wait_until(
            lambda: "refused" in ((refusing.state()["idle_sleep"] or {}).get("held_awake") or ""),
            15,
            "the refused idle sleep said so",
        )
        # one refusal, then 2 s before the next try (4 s after a second: a slow machine may see two)
        records = [r["record"] for r in refusing.oplog() if r["record"].startswith("idle_sleep")]
        held = refusing.state()
        assert held["state"] == "READY" and held["sleep"] is None, held
        assert records in (["idle_sleep", "idle_sleep_refused"], ["idle_sleep", "idle_sleep_refused"] * 2)
        assert "--enable-sleep-mode" in held["idle_sleep"]["held_awake"], held["idle_sleep"]
        assert re.search(r"next try in (2|4|8) s$", held["idle_sleep"]["held_awake"]), held["idle_sleep"]

        # a request for the sleeper's model through a router that follows it: woken, then served
        router, router_url = start_router("idle", sleeper, "30", answering="/v1/fleet")
        await wait_until(lambda: asleep_via(router_url), 10, "the router sees the engine asleep")
        # who sleeps and why reaches the router's /v1/fleet (what the dashboard reads)
        (seen,) = http_json(router_url + "/v1/fleet")[1]["endpoints"]
        assert seen["supervisor"]["reason"].endswith(": idle 1 s"), seen["supervisor"]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            outcome = await stream_once(session, router_url + "/v1/completions", BODY)
        assert outcome.kind == "completed", outcome.detail
        (wake,) = wakes(sleeper)
        assert wake["operation_id"].startswith("wake-on-demand-"), wake
    finally:
        if router is not None:
            router.stop()
        for sup in sups:
            pids = sup.engine_pids()
            sup.proc.stop(grace=20)
            kill_leftovers(pids)
