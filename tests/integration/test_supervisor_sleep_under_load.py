"""Sleep, wake and weight reload of one of two supervised engines while a router carries continuous
streamed load: no client request fails before streaming, no stream breaks, and the engine admits no
request from the moment the router acknowledged its removal until it is READY again other than the
supervisor's own smoke request (checked from the engine's /metrics, as in the confirmed-drain test);
the oplog shows each runbook step in order and the sleep state and memory figures moving."""

from __future__ import annotations

import asyncio

from tests.integration.test_supervisor_confirmed_drain import (
    AdmissionSampler,
    Outcomes,
    all_routable,
    load,
    start_router,
    wait_until,
)
from tests.integration.test_supervisor_support import kill_leftovers, start_supervised
from tests.support.procs import CorralProcess
from tests.support.sleep_load import (
    DEV,
    GIB,
    SIM_ARGS,
    STEPS,
    SUP_ARGS,
    run_op,
    step_records,
    window_arrivals,
)


async def more_answers(out: Outcomes, n: int, what: str) -> None:
    """Wait until `n` more requests have been answered through the router."""
    target = out.completed + n
    await wait_until(lambda: out.completed >= target, 60, f"{n} more answers {what}")


async def test_sleep_wake_and_reload_under_load_fail_no_request() -> None:
    sups = [
        start_supervised(sim_args=(*SIM_ARGS, "--seed", str(i)), sup_args=SUP_ARGS, env=DEV) for i in range(2)
    ]
    router: CorralProcess | None = None
    sampler: AdmissionSampler | None = None
    try:
        for sup in sups:
            await asyncio.to_thread(sup.wait_state, "READY", 30)
        router, url = start_router("router-a", sups)
        await asyncio.to_thread(router.wait_http, url + "/health")
        await wait_until(lambda: all_routable(url), 15, "both endpoints routable")
        victim = sups[0]
        await wait_until(
            lambda: "router-a" in victim.state()["routers"]["subscribed"], 10, "router subscribed"
        )
        sampler = AdmissionSampler(victim.engine_url)
        sampler.start()
        out, stop = Outcomes(), asyncio.Event()
        load_task = asyncio.create_task(load([url], out, stop))
        await more_answers(out, 12, "before the sleep")

        sleep_op = await asyncio.to_thread(run_op, victim, "/v1/sleep", {"level": 1, "mode": "wait"})
        await more_answers(out, 12, "while it sleeps")  # load goes on against the other engine
        wake_op = await asyncio.to_thread(run_op, victim, "/v1/wake", {})
        await wait_until(lambda: all_routable(url), 15, "the woken engine routable again")
        await more_answers(out, 12, "after the wake")
        reload_op = await asyncio.to_thread(run_op, victim, "/v1/reload", {"mode": "wait"})
        await wait_until(lambda: all_routable(url), 15, "the reloaded engine routable again")
        await more_answers(out, 12, "after the reload")
        stop.set()
        await asyncio.wait_for(load_task, 60)
        sampler.halt.set()
        sampler.join(5)

        assert out.failed_before_stream == [], out.failed_before_stream[:5]
        assert out.broken_streams == [], out.broken_streams[:5]
        assert out.completed > 0

        for op in (sleep_op, wake_op, reload_op):
            steps = step_records(victim, op["operation_id"])
            assert [(r["step"], r["status"]) for r in steps] == [(s, "done") for s in STEPS], steps

        sleep_verify = next(
            r for r in step_records(victim, sleep_op["operation_id"]) if r["step"] == "verify"
        )
        assert sleep_verify["evidence"]["sleep_state"] == "weights_offloaded"
        assert sleep_verify["evidence"]["memory"]["cpu_backup_bytes"] == [0, 2 * GIB]
        wake_verify = next(r for r in step_records(victim, wake_op["operation_id"]) if r["step"] == "verify")
        assert wake_verify["evidence"]["figures"]["sleep_state"] == "awake"
        assert wake_verify["evidence"]["figures"]["gpu_weights_bytes"] == 2 * GIB

        # nothing but the supervisor's smoke request reached the engine while it was not READY
        sleep_started = sleep_op["started"]
        assert window_arrivals(victim, sampler, sleep_op["operation_id"], sleep_started) <= 1
        assert window_arrivals(victim, sampler, reload_op["operation_id"], reload_op["started"]) <= 1
    finally:
        if sampler is not None:
            sampler.halt.set()
        if router is not None:
            router.stop()
        for sup in sups:
            pids = sup.engine_pids()
            sup.proc.stop(grace=20)
            kill_leftovers(pids)
