"""Forced exits named, with real processes: a supervised `corral sim` behind the admission gate, a drain
whose deadline is shorter than a long stream: the stream (tokens already sent) and a request still in
its long prefill (no token yet) are both cut when the engine is stopped, and each is named by its
request id with `tokens_emitted` in the oplog's forced_exit records and the drain report, and counted
by `corral_supervisor_forced_exit_requests_total`. Without a gate the report says forced exits were not
observable, instead of an empty list that would read as "none"."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from typing import Any

import aiohttp
import orjson

from corral.contracts.operations import OperationRecord
from corral.contracts.records import ChangeRecord
from tests.integration.test_supervisor_support import Supervised, http_json, supervised
from tests.support.procs import CorralProcess, free_port

# a stream of 2000 tokens at 100 ms each outlives any deadline here; a prompt of 1500 tokens at 20 ms
# per token is 30 s of prefill, so that request is still waiting for its first token at the stop
SIM_ARGS = ("--itl-ms", "100", "--prefill-ms-per-token", "20")
DRAIN_ARGS = (
    "--propagation-timeout",
    "1",
    "--quiet-period",
    "0.3",
    "--drain-timeout",
    "1",
    "--shutdown-timeout",
    "2",
)


async def read_stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], request_id: str, first: asyncio.Event
) -> tuple[str, list[bytes]]:
    """POST a streaming request; `first` is set once an event carrying text has arrived. How it ended
    (done with [DONE], cut, or an HTTP status) and the events read."""
    headers = {"content-type": "application/json", "x-request-id": request_id}
    events: list[bytes] = []
    async with session.post(url, data=orjson.dumps(body), headers=headers) as resp:
        if resp.status != 200:
            return f"HTTP {resp.status}", events
        try:
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                events.append(line[6:].strip())
                event = orjson.loads(events[-1]) if events[-1] != b"[DONE]" else {}
                if any(c.get("text") for c in event.get("choices") or ()):
                    first.set()
        except aiohttp.ClientError:
            return "cut", events
    return ("done" if events and events[-1] == b"[DONE]" else "ended"), events


def wait_operation(sup: Supervised, op_id: str, within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        status, op = http_json(f"{sup.url}/v1/operations/{op_id}")
        if status == 200 and op["status"] != "running":
            return op
        assert time.monotonic() < deadline, op
        time.sleep(0.2)


def metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return resp.read().decode()


def start_router(backend: str) -> tuple[CorralProcess, str]:
    """A router with the gate as its one static backend, once it routes there."""
    port = free_port()
    router = CorralProcess(["router", "--host", "127.0.0.1", "--port", str(port), "--backend", backend])
    url = f"http://127.0.0.1:{port}"
    router.wait_http(url + "/health")
    deadline = time.monotonic() + 30
    while not any(e["routable"] for e in http_json(url + "/v1/fleet")[1]["endpoints"]):
        assert time.monotonic() < deadline, router.output()[-2000:]
        time.sleep(0.1)
    return router, url


async def test_a_drain_past_its_deadline_names_the_requests_it_cut() -> None:
    gate_port = free_port()
    gate_args = ("--gate-port", str(gate_port), "--gate-host", "127.0.0.1")
    router: CorralProcess | None = None
    try:
        with supervised(sim_args=SIM_ARGS, sup_args=(*gate_args, *DRAIN_ARGS)) as sup:
            await asyncio.to_thread(sup.wait_state, "READY", 30)
            gate = f"http://127.0.0.1:{gate_port}"
            url = gate + "/v1/completions"
            router, router_url = await asyncio.to_thread(start_router, gate)
            long_stream = {"model": "sim-model", "prompt": "hi", "max_tokens": 2000, "stream": True}
            long_prefill = {"model": "sim-model", "prompt": " the" * 1500, "max_tokens": 4, "stream": True}
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                streaming_first, waiting_first = asyncio.Event(), asyncio.Event()
                # the stream through the router (which forwards the client's id), the waiting request direct
                streaming = asyncio.create_task(
                    read_stream(
                        session, router_url + "/v1/completions", long_stream, "fx-streaming", streaming_first
                    )
                )
                await asyncio.wait_for(streaming_first.wait(), 30)
                waiting = asyncio.create_task(
                    read_stream(session, url, long_prefill, "fx-waiting", waiting_first)
                )
                deadline = time.monotonic() + 30
                while (await asyncio.to_thread(sup.state))["gate"]["in_flight"] != {"sim-model": 2}:
                    assert time.monotonic() < deadline and not waiting.done()
                    await asyncio.sleep(0.05)

                status, op = await asyncio.to_thread(http_json, sup.url + "/v1/drain", "POST", {})
                assert status == 202, op
                op = await asyncio.to_thread(wait_operation, sup, op["operation_id"], 60)
                stream_end, stream_events = await asyncio.wait_for(streaming, 30)
                waiting_end, waiting_events = await asyncio.wait_for(waiting, 30)

            assert op["status"] == "succeeded", op
            report = op["result"]
            # the deadline forced the stop: the engine (whose own shutdown aborts and never answers) was
            # SIGKILLed, and both requests were cut there, never replayed nor ended as if complete
            assert report["in_flight_drained"] is False and report["engine_killed"] is True, report
            # the router's client gets the error event naming the request (vLLM's [DONE] after it), no replay
            error_event = stream_events[-2] if len(stream_events) >= 2 else b""
            assert stream_end == "done" and error_event.startswith(b'{"error"'), stream_events[-3:]
            assert b"request fx-streaming was not replayed" in error_event, error_event
            assert waiting_end == "cut" and not waiting_first.is_set(), waiting_events
            forced = {e["request_id"]: e for e in report["forced_exits"]}
            print("drain report forced_exits:", orjson.dumps(report["forced_exits"]).decode())
            assert set(forced) == {"fx-streaming", "fx-waiting"}, forced
            assert forced["fx-streaming"]["tokens_emitted"] is True
            assert forced["fx-waiting"]["tokens_emitted"] is False
            for exit_ in forced.values():
                assert exit_["how"] == "cut" and exit_["path"] == "/v1/completions"
                assert exit_["model"] == "sim-model" and exit_["started"] <= exit_["ended"]
            assert report["forced_exits_not_listed"] == 0 and report["forced_exits_unobserved"] is None
            typed = OperationRecord.model_validate(op).drain_result().forced_exits
            assert typed is not None and {e.request_id: e.tokens_emitted for e in typed} == {
                "fx-streaming": True,
                "fx-waiting": False,
            }

            records = [r for r in sup.oplog() if r["record"] == "forced_exit"]
            assert {(r["request_id"], r["tokens_emitted"]) for r in records} == {
                ("fx-streaming", True),
                ("fx-waiting", False),
            }, records
            # the drain's change record (its result and the oplog) names them too, with the gate's counts
            change = ChangeRecord.model_validate(report["change_record"])
            assert change.kind == "drain" and change.forced_exits is not None
            assert {e.request_id: e.tokens_emitted for e in change.forced_exits} == {
                "fx-streaming": True,
                "fx-waiting": False,
            }
            assert change.request_failures is not None and change.request_failures.during.stream_failures == 2
            assert [s.step for s in change.steps] == ["remove_from_routing", "drain_policy", "stop_engine"]
            assert not change.steps[2].ok and "SIGKILL" in change.steps[2].detail, change.steps
            assert [r["id"] for r in sup.oplog() if r["record"] == "change_record"] == [op["operation_id"]]
            stopped = sup.transitions()[-1]
            assert stopped["sub_state"] == "engine_stopped"
            assert {e["request_id"] for e in stopped["evidence"]["forced_exits"]} == set(forced)
            text = await asyncio.to_thread(metrics, sup.url)
            assert 'corral_supervisor_forced_exit_requests_total{tokens_emitted="true"} 1.0' in text
            assert 'corral_supervisor_forced_exit_requests_total{tokens_emitted="false"} 1.0' in text
            routed = await asyncio.to_thread(metrics, router_url)
            assert 'corral_router_stream_failures_total{how="cut",model="sim-model"} 1.0' in routed
            split = 'how="cut",model="sim-model",tokens_emitted="true"'
            assert f"corral_router_stream_failures_by_tokens_total{{{split}}} 1.0" in routed, routed
    finally:
        if router is not None:
            router.stop()


def test_without_a_gate_forced_exits_are_not_observable_rather_than_none() -> None:
    with supervised(sim_args=SIM_ARGS, sup_args=DRAIN_ARGS) as sup:
        sup.wait_state("READY", 30)
        status, op = http_json(sup.url + "/v1/drain", "POST", {})
        assert status == 202, op
        op = wait_operation(sup, op["operation_id"], 60)
        report = op["result"]
        assert (
            report["forced_exits"] is None
            and OperationRecord.model_validate(op).drain_result().forced_exits is None
        )
        assert "--gate-port" in report["forced_exits_unobserved"]
        change = ChangeRecord.model_validate(report["change_record"])
        assert change.forced_exits is None and change.request_failures is None
        assert any(n.startswith("forced_exits: no admission gate") for n in change.not_measured), change
        assert "forced_exit_requests" not in metrics(sup.url)
