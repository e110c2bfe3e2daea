"""The drain waits for what the admission gate still has open, not only for the engine's running +
waiting count: a supervised `corral sim` whose API server spends a while rendering a long prompt
before its engine core counts it (`--render-ms-per-token`, as vLLM's tokenizer on a long prompt), a
streaming request through the gate that the engine's gauges read as 0 when the drain begins. The
drain must not SIGTERM the engine until that response has ended: the client gets its whole answer,
and the drain report names no forced exit."""

from __future__ import annotations

import asyncio

import aiohttp

from corral.engine.load_sample import fetch_load
from tests.integration.test_forced_exits import read_stream, wait_operation
from tests.integration.test_supervisor_support import http_json, supervised
from tests.support.procs import free_port
from tests.support.waits import wait_until

# 600 prompt tokens at 20 ms each: 12 s in the API server before the engine counts the request, far
# longer than the drain takes to leave routing (no routers, a 0.2 s quiet period) and reach its stop
PROMPT = " the" * 600
SIM_ARGS = ("--render-ms-per-token", "20", "--itl-ms", "5")
DRAIN_ARGS = (
    "--propagation-timeout",
    "2",
    "--quiet-period",
    "0.2",
    "--drain-timeout",
    "60",
    "--shutdown-timeout",
    "2",
)


async def test_the_drain_waits_for_a_response_open_at_the_gate_that_the_engine_does_not_count() -> None:
    gate_port = free_port()
    gate_args = ("--gate-port", str(gate_port), "--gate-host", "127.0.0.1")
    with supervised(sim_args=SIM_ARGS, sup_args=(*gate_args, *DRAIN_ARGS)) as sup:
        await asyncio.to_thread(sup.wait_state, "READY", 30)
        url = f"http://127.0.0.1:{gate_port}/v1/completions"
        body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 4, "stream": True}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            first = asyncio.Event()
            stream = asyncio.create_task(read_stream(session, url, body, "rendering-1", first))
            # the premise: open at the gate while the engine's own gauges count nothing
            opened = lambda: stream.done() or sup.state()["gate"]["in_flight"] == {"sim-model": 1}  # noqa: E731
            await asyncio.to_thread(wait_until, opened, 30, "the request open at the gate")
            assert not stream.done(), stream.result()
            load = await fetch_load(session, sup.engine_url, within=5.0)
            assert load.in_flight == 0 and not first.is_set(), load

            status, op = await asyncio.to_thread(http_json, sup.url + "/v1/drain", "POST", {})
            assert status == 202, op
            op = await asyncio.to_thread(wait_operation, sup, op["operation_id"], 90)
            how, events = await asyncio.wait_for(stream, 30)

        assert op["status"] == "succeeded", op
        report = op["result"]
        # the whole answer reached the client before the stop, and nothing was cut
        assert how == "done" and first.is_set(), (how, events[-3:], report)
        assert report["forced_exits"] == [], report["forced_exits"]
        assert report["in_flight_drained"] is True and report["gate_open_at_end"] == 0, report
        assert report["cut_short"] is None, report
