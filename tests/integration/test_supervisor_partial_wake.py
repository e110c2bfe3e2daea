"""A wake in steps (`tags`): a partial wake is performed and verified, the engine stays SLEEPING and
unroutable (the supervisor's /readyz 503, the router's /v1/fleet not routable) with the woken tags
in /v1/state, and the wake of the remaining tags (through `corral wake --tags`) or one without tags
completes it: full VERIFY, smoke, READY, routable again. Tags that do not exist, are not asleep, or
would resume scheduling early are refused with 409 and nothing changed. Real processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

from tests.integration.test_supervisor_confirmed_drain import fleet, start_router, wait_until
from tests.integration.test_supervisor_sleep_ops import DEV, GIB, SIM_ARGS, STEPS
from tests.integration.test_supervisor_support import Supervised, http_json, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess

SUP_ARGS = ("--propagation-timeout", "5", "--quiet-period", "0.3")


def call(s: Supervised, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    return http_json(s.url + path, "POST", body or {})


def run_op(s: Supervised, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, op = call(s, path, body)
    assert status == 202, op
    final = s.wait_for(
        f"{path} finished",
        lambda b: any(
            o["operation_id"] == op["operation_id"] and o["status"] != "running" for o in b["operations"]
        ),
        30,
    )
    (done,) = [o for o in final["operations"] if o["operation_id"] == op["operation_id"]]
    return done


def step_evidence(s: Supervised, op_id: str, step: str) -> dict[str, Any]:
    (record,) = [
        r
        for r in s.oplog()
        if r["record"] == "runbook_step" and r["operation_id"] == op_id and r["step"] == step
    ]
    return dict(record["evidence"])


def routable(router_url: str) -> bool:
    (endpoint,) = fleet(router_url)["endpoints"]
    return bool(endpoint["routable"]) and endpoint["supervisor"]["stream"] == "connected"


def refused(s: Supervised, body: dict[str, Any], words: str) -> None:
    epoch = s.state()["epoch"]
    status, answer = call(s, "/v1/wake", body)
    assert status == 409 and words in answer["error"]["message"], answer
    assert s.state()["epoch"] == epoch  # nothing changed


async def test_partial_wake_stays_unroutable_until_the_remaining_tags_complete_it() -> None:
    sup = start_supervised(sim_args=SIM_ARGS, sup_args=SUP_ARGS, env=DEV)
    router: CorralProcess | None = None
    try:
        await asyncio.to_thread(sup.wait_state, "READY", 30)
        router, url = start_router("router-a", [sup])
        await asyncio.to_thread(router.wait_http, url + "/health")
        await wait_until(lambda: routable(url), 15, "the engine routable")
        await wait_until(lambda: "router-a" in sup.state()["routers"]["subscribed"], 10, "subscribed")

        op = await asyncio.to_thread(run_op, sup, "/v1/sleep", {"level": 1, "mode": "wait"})
        assert op["status"] == "succeeded", op

        await asyncio.to_thread(refused, sup, {"tags": ["weights", "gpu"]}, "do not exist")
        await asyncio.to_thread(refused, sup, {"tags": ["scheduling"]}, "resume serving")

        op = await asyncio.to_thread(
            run_op, sup, "/v1/wake", {"tags": ["weights"], "operation_id": "wake-weights"}
        )
        assert op["status"] == "succeeded", op
        steps = [
            (r["step"], r["status"])
            for r in sup.oplog()
            if r["record"] == "runbook_step" and r["operation_id"] == "wake-weights"
        ]
        assert steps == [(s, "done") for s in STEPS]
        assert step_evidence(sup, "wake-weights", "precheck")["sequence"] == ["wake_up?tags=weights"]
        verify = step_evidence(sup, "wake-weights", "verify")
        assert verify["is_sleeping"] is True
        assert verify["memory"]["gpu_weights_bytes"] == [2 * GIB, 2 * GIB]
        assert verify["memory"]["gpu_kv_cache_bytes"] == [4 * GIB, 0]
        body = sup.state()
        assert body["state"] == "SLEEPING" and body["sub_state"] == "partially_awake", body
        assert body["sleep"]["woken_tags"] == ["weights"] and body["sleep"]["asleep_tags"] == ["kv_cache"]
        status, readyz = sup.probe("/readyz")
        assert status == 503 and readyz["state"] == "SLEEPING", readyz
        (endpoint,) = fleet(url)["endpoints"]
        assert not endpoint["routable"], endpoint
        seen = time.monotonic()

        def heard_since() -> bool:
            limit = time.monotonic() - seen  # the one monotonic clock of this host, the router's too
            (e,) = fleet(url)["endpoints"]
            ago = e["supervisor"]["heard_seconds_ago"]
            return ago is not None and ago < limit

        await wait_until(heard_since, 30, "a line from the supervisor after that")
        assert not routable(url)  # a heartbeat later, still out of routing

        await asyncio.to_thread(refused, sup, {"tags": ["weights"]}, "not asleep")

        woke = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "corral", "wake", "--supervisor", sup.url, "--tags", "kv_cache"],
            env={**os.environ, "XDG_STATE_HOME": str(sup.state_dir.parent)},  # its change record goes there
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        # the printed answer is the contract: what the person who ran the command reads
        assert woke.returncode == 0 and "succeeded" in woke.stdout, woke
        body = sup.state()
        assert body["state"] == "READY" and body["sleep"] is None, body
        assert sup.probe("/readyz")[0] == 200
        await wait_until(lambda: routable(url), 10, "the engine routable again")
        states = [(t["state"], t["sub_state"]) for t in sup.transitions()]
        tail = states[states.index(("SLEEPING", "partially_awake")) :]
        assert tail[-2:] == [("WAKING", "waking"), ("READY", None)], tail
    finally:
        if router is not None:
            router.stop()
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)


def test_level_2_wakes_weights_with_reload_first_then_an_untagged_wake_completes() -> None:
    sup = start_supervised(sim_args=SIM_ARGS, sup_args=SUP_ARGS, env=DEV)
    try:
        sup.wait_state("READY", 30)
        assert run_op(sup, "/v1/sleep", {"level": 2, "mode": "abort"})["status"] == "succeeded"
        refused(sup, {"tags": ["weights"]}, "reload")
        op = run_op(sup, "/v1/wake", {"tags": ["weights"], "reload": True, "operation_id": "w2"})
        assert op["status"] == "succeeded", op
        assert step_evidence(sup, "w2", "precheck")["sequence"] == [
            "wake_up?tags=weights",
            "collective_rpc reload_weights",
        ]
        assert step_evidence(sup, "w2", "verify")["figures"]["weights_valid"] == 1
        assert sup.state()["state"] == "SLEEPING"
        op = run_op(sup, "/v1/wake", {"operation_id": "w2-rest"})  # no reload needed any more
        assert op["status"] == "succeeded", op
        assert step_evidence(sup, "w2-rest", "precheck")["sequence"] == ["wake_up?tags=kv_cache", "wake_up"]
        assert step_evidence(sup, "w2-rest", "verify")["smoke"]["text"]
        assert sup.state()["state"] == "READY"
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)
