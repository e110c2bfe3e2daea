"""Forced exits named in a `corral up` fleet, whose supervisors run their admission gates: a stream
through the router that outlives the fleet's drain deadline is cut by a rollout's DRAIN, and its
request id is in the old supervisor's oplog and in the rollout's change record with
`tokens_emitted: true`, the router counts the cut by tokens sent, and the client got an error event
naming the request (never a silent end). A second stream, cut by a drain asked of the new group's
supervisor, is counted by `corral_supervisor_forced_exit_requests_total` there (a rollout's old
supervisor is retired right after its DRAIN, so its /metrics cannot be read afterwards)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.integration.test_forced_exits import metrics, read_stream
from tests.integration.test_rollout import corral, fleet_file, read_token, stop_up
from tests.integration.test_up import start_up

# 2000 tokens (the sim's max_model_len) at 100 ms each, 20 ms on the new bundle: streams that outlive
# every step here (a rollout, a drain), whose deadline is 1 s
SIM = ("--sim-arg=--itl-ms=100",)
LONG_STREAM = {"model": "sim-model", "prompt": "hi", "max_tokens": 2000, "stream": True}


async def _json(
    session: aiohttp.ClientSession, method: str, url: str, token: str, body: Any = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    async with session.request(method, url, json=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def _drain(session: aiohttp.ClientSession, supervisor: str, token: str) -> dict[str, Any]:
    """The supervisor's drain report, once its drain operation has ended."""
    status, op = await _json(session, "POST", supervisor + "/v1/drain", token, {})
    assert status == 202, op
    for _ in range(600):  # bounded: 60 s
        status, op = await _json(session, "GET", f"{supervisor}/v1/operations/{op['operation_id']}", token)
        if op["status"] != "running":
            break
        await asyncio.sleep(0.1)
    assert op["status"] == "succeeded", op
    report: dict[str, Any] = op["result"]
    return report


def _cut_with_an_error_event(end: str, events: list[bytes], request_id: str) -> None:
    error_event = events[-2] if len(events) >= 2 else b""
    assert end == "done" and error_event.startswith(b'{"error"'), events[-3:]
    assert f"request {request_id} was not replayed".encode() in error_event, error_event


def _oplog(logs: Path, engine: str) -> list[dict[str, Any]]:
    text = (logs / f"{engine}.state" / "oplog.jsonl").read_text()
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


async def test_a_rollout_drain_past_its_deadline_names_the_stream_it_cut(tmp_path: Path) -> None:
    state, logs = tmp_path / "state", tmp_path / "logs"
    proc, url = start_up(
        "--engines", "1", "--drain-timeout", "1", "--log-dir", str(logs), *SIM, state_home=state
    )
    port = url.rsplit(":", 1)[1]
    try:
        fleet = fleet_file(state, url)
        token = read_token(fleet, "supervisor_token_file")
        (old,) = fleet["engines"]
        bundle = tmp_path / "v2.yaml"
        bundle.write_text('name: v2\nengine_args: ["--itl-ms", "20"]\n')
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            # the engine URL the fleet routes to is the supervisor's gate, in front of the engine
            _, before = await _json(session, "GET", old["supervisor"] + "/v1/state", token)
            assert before["gate"] is not None and before["engine"]["url"] != old["engine"], before["engine"]

            first = asyncio.Event()
            streaming = asyncio.create_task(
                read_stream(session, url + "/v1/completions", LONG_STREAM, "fx-rollout", first)
            )
            await asyncio.wait_for(first.wait(), 30)
            code, output = await corral(state, "rollout", "--port", port, "--to", str(bundle))
            if code != 0:
                streaming.cancel()
            assert code == 0, output
            end, events = await asyncio.wait_for(streaming, 30)
            _cut_with_an_error_event(end, events, "fx-rollout")

            record = orjson.loads((state / "corral" / f"rollout-{port}.json").read_bytes())
            (drain,) = [s for s in record["steps"] if s["step"] == "DRAIN"]
            report = drain["data"]["reports"][old["name"]]
            print("rollout DRAIN report forced_exits:", orjson.dumps(report["forced_exits"]).decode())
            assert report["in_flight_drained"] is False and report["forced_exits_unobserved"] is None
            (cut,) = report["forced_exits"]
            assert cut["request_id"] == "fx-rollout" and cut["tokens_emitted"] is True, cut
            assert cut["path"] == "/v1/completions" and cut["model"] == "sim-model", cut
            # and in the record's own section, where every DRAIN's forced exits are gathered
            listed = [(e["request_id"], e["tokens_emitted"]) for e in record["forced_exits"]]
            assert listed == [("fx-rollout", True)], record["forced_exits"]
            assert not [n for n in record["not_measured"] if n.startswith("forced")], record["not_measured"]

            logged = [r for r in _oplog(logs, old["name"]) if r["record"] == "forced_exit"]
            assert [(r["request_id"], r["tokens_emitted"]) for r in logged] == [("fx-rollout", True)], logged
            routed = await asyncio.to_thread(metrics, url)
            split = 'how="cut",model="sim-model",tokens_emitted="true"'
            assert f"corral_router_stream_failures_by_tokens_total{{{split}}} 1.0" in routed, routed

            # the new group's supervisor, drained past the same deadline under a second stream
            (new,) = fleet_file(state, url)["engines"]
            assert new["name"] != old["name"]
            first = asyncio.Event()
            streaming = asyncio.create_task(
                read_stream(session, url + "/v1/completions", LONG_STREAM, "fx-drain", first)
            )
            await asyncio.wait_for(first.wait(), 30)
            report = await _drain(session, new["supervisor"], token)
            end, events = await asyncio.wait_for(streaming, 30)
            _cut_with_an_error_event(end, events, "fx-drain")
            assert [(e["request_id"], e["tokens_emitted"]) for e in report["forced_exits"]] == [
                ("fx-drain", True)
            ], report["forced_exits"]
            counted = await asyncio.to_thread(metrics, new["supervisor"])
            assert 'corral_supervisor_forced_exit_requests_total{tokens_emitted="true"} 1.0' in counted
            assert 'corral_supervisor_forced_exit_requests_total{tokens_emitted="false"} 0.0' in counted
            logged = [r for r in _oplog(logs, new["name"]) if r["record"] == "forced_exit"]
            assert [(r["request_id"], r["tokens_emitted"]) for r in logged] == [("fx-drain", True)], logged
    finally:
        stop_up(proc)
