"""`corral doctor` against real processes on loopback for the branches a sleeping engine or a router
can hide: a partial wake through the supervisor (the engine still sleeping, unroutable), a sleep that
released no memory (an engine without sleep mode), and streams the engine aborted, counted by the
router."""

from __future__ import annotations

import asyncio

import httpx

from tests.integration.test_doctor import doctor
from tests.integration.test_supervisor_partial_wake import run_op
from tests.integration.test_supervisor_sleep_ops import DEV, SIM_ARGS
from tests.integration.test_supervisor_support import kill_leftovers, start_supervised
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until


def test_partial_wake_is_its_own_branch_with_the_wake_that_completes_it() -> None:
    sup = start_supervised(sim_args=SIM_ARGS, sup_args=("--quiet-period", "0.2"), env=DEV)
    try:
        sup.wait_state("READY", 30)
        assert run_op(sup, "/v1/sleep", {"level": 1, "mode": "wait"})["status"] == "succeeded"
        code, branches, out = doctor("--supervisor", sup.url)
        assert (code, branches) == (1, ["not-ready/sleeping"]), out
        assert run_op(sup, "/v1/wake", {"tags": ["weights"]})["status"] == "succeeded"
        code, branches, out = doctor("--supervisor", sup.url)
        assert (code, branches) == (1, ["not-ready/partial-wake"]), out
        assert "still asleep" in out and "corral wake --supervisor" in out and "--tags" in out, out
        assert run_op(sup, "/v1/wake", {"tags": ["kv_cache"]})["status"] == "succeeded"
        code, branches, out = doctor("--supervisor", sup.url)
        assert (code, branches) == (0, ["healthy"]), out
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)


def test_a_sleep_that_released_no_memory() -> None:
    # no --enable-sleep-mode: the engine accepts /sleep and frees nothing
    sup = start_supervised(sim_args=("--weights-gib", "2", "--kv-cache-gib", "4"), env=DEV)
    try:
        sup.wait_state("READY", 30)
        assert httpx.post(sup.engine_url + "/sleep", params={"level": 1}, timeout=10).status_code == 200
        code, branches, out = doctor("--supervisor", sup.url)
        assert (code, branches) == (1, ["memory/not-released"]), out
        assert "weights 2.00 GiB" in out and "enable-sleep-mode" in out, out
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)


async def _stream_then_abort(router_url: str, engine_url: str) -> bytes:
    body = {"model": "sim-model", "prompt": "a long story", "max_tokens": 2000, "stream": True}
    async with httpx.AsyncClient(timeout=30) as client:
        async with client.stream("POST", router_url + "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            received = b""
            async for chunk in resp.aiter_bytes():
                if not received:
                    aborted = await client.post(engine_url + "/abort_requests", json={})
                    assert aborted.status_code == 200, aborted.text
                received += chunk
            return received


def test_streams_aborted_by_the_engine_are_counted_by_the_router_and_named() -> None:
    engine_port = free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    sim = CorralProcess(
        ["sim", "--host", "127.0.0.1", "--port", str(engine_port), "--model", "sim-model", "--itl-ms", "20"],
        env=DEV,
    )
    sim.wait_http(engine_url + "/health")
    port = free_port()
    router = CorralProcess(["router", "--host", "127.0.0.1", "--port", str(port), "--backend", engine_url])
    router_url = f"http://127.0.0.1:{port}"
    try:
        router.wait_http(router_url + "/health")
        wait_until(lambda: httpx.get(router_url + "/v1/models", timeout=2).json()["data"] != [], 15, "models")
        received = asyncio.run(_stream_then_abort(router_url, engine_url))
        assert b'"finish_reason":"abort"' in received, received[-300:]
        metrics = httpx.get(router_url + "/metrics", timeout=5).text
        assert 'corral_router_stream_failures_total{how="engine_abort",model="sim-model"} 1.0' in metrics
        code, branches, out = doctor("--router", router_url)
        assert code == 1 and "requests-failing/aborted-streams" in branches, out
        assert "engine_abort×1" in out and "mode abort" in out, out
    finally:
        router.stop()
        sim.stop()
