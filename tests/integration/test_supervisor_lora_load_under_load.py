"""Loading a LoRA adapter on one of two engines while clients stream requests for the base model
through the router: no request fails, the engine stays in routing (a load takes nothing out), the
router routes the adapter only to that engine once its supervisor says it serves it, and every
request for the adapter from then on succeeds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from tests.integration.test_supervisor_confirmed_drain import all_routable, fleet, start_router, wait_until
from tests.integration.test_supervisor_lora import ENV, SIM_ARGS, STEPS, run_op, steps
from tests.integration.test_supervisor_support import kill_leftovers, start_supervised
from tests.support.procs import CorralProcess
from tests.support.streams import stream_once
from tests.support.waits import eventually


async def base_model_load(url: str, counts: dict[str, list[str]], stop: asyncio.Event) -> None:
    body = {"model": "sim-model", "prompt": "hello base", "max_tokens": 10, "stream": True}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def worker() -> None:
            for _ in range(5000):  # bounded; the test stops it long before
                if stop.is_set():
                    return
                outcome = await stream_once(session, url + "/v1/completions", body)
                counts.setdefault(outcome.kind, []).append(outcome.detail)

        await asyncio.gather(*(worker() for _ in range(8)))


def adapter_engines(url: str) -> set[str]:
    return {e["url"] for e in fleet(url)["endpoints"] if "adapter-b" in e["models"] and e["routable"]}


async def test_an_adapter_loaded_under_load_fails_no_request_and_is_routed_only_where_loaded(
    tmp_path: Path,
) -> None:
    adapter = tmp_path / "adapter-b"
    adapter.mkdir()
    sups = [
        start_supervised(
            sim_args=(*SIM_ARGS, "--seed", str(i)), sup_args=("--propagation-timeout", "5"), env=ENV
        )
        for i in range(2)
    ]
    router: CorralProcess | None = None
    try:
        for sup in sups:
            await asyncio.to_thread(sup.wait_state, "READY", 30)
        router, url = start_router("router-a", sups)
        await asyncio.to_thread(router.wait_http, url + "/health")
        await wait_until(lambda: all_routable(url), 15, "both endpoints routable")
        target, other = sups
        epoch_before = target.state()["epoch"]

        counts: dict[str, list[str]] = {}
        stop = asyncio.Event()
        load_task = asyncio.create_task(base_model_load(url, counts, stop))

        def completed() -> int:
            return len(counts.get("completed", []))

        await eventually(lambda: completed() >= 10, "base-model load flowing", within=60)
        op = await asyncio.to_thread(
            run_op,
            target,
            "/v1/lora/load",
            {"name": "adapter-b", "path": str(adapter), "operation_id": "ld-b"},
        )
        await wait_until(lambda: adapter_engines(url) == {target.engine_url}, 10, "adapter-b routed")
        adapter_results: list[Any] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            for _ in range(10):
                body = {"model": "adapter-b", "prompt": "hi", "max_tokens": 4, "stream": True}
                adapter_results.append(await stream_once(session, url + "/v1/completions", body))
        after = completed()
        # the base model's load goes on after the adapter came (and is enough to mean something)
        await eventually(lambda: completed() >= max(after + 10, 51), "answers after it", within=60)
        stop.set()
        await asyncio.wait_for(load_task, 60)

        assert op["status"] == "succeeded", op
        assert [(r["step"], r["status"]) for r in steps(target, "ld-b")] == [(s, "done") for s in STEPS]
        assert counts.get("failed_before_stream", []) == [], counts.get("failed_before_stream", [])[:5]
        assert counts.get("broken", []) == [], counts.get("broken", [])[:5]
        assert len(counts.get("completed", [])) > 50
        assert [r.kind for r in adapter_results] == ["completed"] * 10, [r.detail for r in adapter_results]
        # the load never took the engine out of routing: it stayed READY (same state, new epoch)
        transitions = [t for t in target.transitions() if t["epoch"] > epoch_before]
        assert transitions and all(t["to"] == "READY" for t in transitions), transitions
        assert other.state()["adapters"]["served"] == []
        assert sorted(target.state()["adapters"]["served"]) == ["adapter-b"]
    finally:
        if router is not None:
            router.stop()
        for sup in sups:
            pids = sup.engine_pids()
            sup.proc.stop(grace=20)
            kill_leftovers(pids)
