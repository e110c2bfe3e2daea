"""An engine whose `/health` keeps answering while generation stops (`corral sim --hang-after N`, vLLM's
hung engine core) is the stall rule's, not the not-answering rule's (issue 30): under load through a
router it stays READY until `--stall-seconds` of running requests without a token, then it is FAILED and
restarted in place; the router abandons the requests hung on it and retries them on the other engine, so
no client request fails; `corral doctor` and the state tell it apart from an engine that answers nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from tests.integration.test_frozen_engine_under_load import (
    Load,
    clients,
    metrics_text,
    routing_to,
    sample,
    until,
)
from tests.integration.test_supervisor_support import Supervised, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess

STALL_SECONDS = 4.0
HANG_AFTER = 25  # the smoke request and 24 of the load's, then every request hangs with /health 200


async def test_a_hung_engine_answering_health_is_failed_by_the_stall_rule_and_its_requests_retried() -> None:
    sup_args = ("--stall-seconds", f"{STALL_SECONDS:g}", "--failure-restarts", "1")
    victim = start_supervised(sim_args=("--itl-ms", "20", "--hang-after", str(HANG_AFTER)), sup_args=sup_args)
    survivor = start_supervised(sim_args=("--itl-ms", "20", "--seed", "1"), sup_args=sup_args)
    sups: list[Supervised] = [victim, survivor]
    router: tuple[CorralProcess, str] | None = None
    load = Load()
    load_task: asyncio.Task[None] | None = None
    try:
        router = await routing_to(sups)
        router_url = router[1]
        load_task = asyncio.create_task(clients(router_url, load))
        body = await asyncio.to_thread(
            victim.wait_for,
            "restarted and READY",
            lambda b: len(b["restarts"]) == 1 and b["state"] == "READY",
            120,
        )
        transitions = [t for t in victim.transitions() if t["from"] is not None]
        failed = next(t for t in transitions if t["to"] == "FAILED")
        before = transitions[: transitions.index(failed)]
        # /health answered throughout: never withdrawn as not answering; the stall rule failed it from READY
        assert all(t["sub_state"] != "not_answering" for t in before), before
        assert failed["from"] == "READY" and "engine stalled" in failed["reason"], failed
        assert f"--stall-seconds {STALL_SECONDS:g}" in failed["reason"], failed
        # not before --stall-seconds: the rule's own record of how long tokens stood still under load
        assert failed["evidence"]["stuck_seconds"] >= STALL_SECONDS and failed["evidence"]["running"] >= 1
        assert body["restarts"][0]["reason"] == failed["reason"] and len(victim.engine_pids()) == 2

        await until(
            lambda: (
                sample(metrics_text(router_url), 'corral_router_abandoned_requests_total{outcome="retried"}')
                >= 1
            ),
            time.monotonic() + 30,
            "the router's retries of the abandoned requests",
        )
        load.stop.set()
        await asyncio.wait_for(load_task, 120)
        load_task = None
        assert load.calls and not load.failed(), [(c.status, c.error) for c in load.failed()][:5]
        print(f"\n{len(load.calls)} requests, none failed; stalled: {failed['reason']}")
    finally:
        load.stop.set()
        if load_task is not None:
            load_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await load_task
        if router is not None:
            router[0].stop()
        for sup in sups:
            pids = sup.engine_pids()
            sup.proc.stop(grace=20)
            kill_leftovers(pids)
