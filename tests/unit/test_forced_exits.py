"""Forced exits named: when tokens have reached a client (vLLM's SSE events, split anywhere), the
gate's in-flight requests and what they record when the engine's side ends one, what a drain report
says of them with and without a gate, and the router's stream-failure split by tokens_emitted."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, generate_latest

from corral.engine.stream_ending import CUT, ENGINE_ABORT, FirstToken, StreamEnding
from corral.router.telemetry.metrics import RouterCollector, RouterMetrics
from corral.supervisor.http.admission import AdmissionGate
from corral.supervisor.http.admission_metrics import AdmissionCollector
from corral.supervisor.http.inflight import ForcedExit, InFlightRequests
from corral.supervisor.lifecycle.drain import DrainPolicy, DrainSequence, DrainSettings
from corral.supervisor.lifecycle.forced_exits import (
    FORCED_EXITS_LISTED,
    NO_GATE,
    OPEN_AFTER_EXIT,
    name_forced_exits,
)
from corral.supervisor.lifecycle.routers import RouterSubscriptions
from corral.supervisor.lifecycle.states import EngineState, StateMachine

ROLE = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n'
TEXT = b'data: {"id":"c","choices":[{"index":0,"text":" the","finish_reason":null}]}\n\n'
ABORT = b'data: {"id":"c","choices":[{"index":0,"text":"","finish_reason":"abort"}]}\n\n'
ERROR = b'data: {"error":{"message":"boom","type":"InternalServerError","code":500}}\n\n'


def fed(*chunks: bytes) -> FirstToken:
    first = FirstToken()
    for chunk in chunks:
        first.feed(chunk)
    return first


def test_a_chat_role_chunk_an_abort_or_an_error_is_no_token() -> None:
    assert not fed(ROLE).seen
    assert not fed(ROLE, ABORT, b"data: [DONE]\n\n").seen
    assert not fed(ERROR).seen
    assert fed(ROLE, TOKEN).seen
    assert fed(TEXT).seen


def test_a_token_split_anywhere_is_seen_once_its_event_is_whole() -> None:
    stream = ROLE + TOKEN
    for cut in range(1, len(stream)):
        first = fed(stream[:cut])
        assert not first.seen or cut >= len(stream) - 1, cut
        first.feed(stream[cut:])
        assert first.seen, cut
    dribbled = fed(*(bytes([b]) for b in TEXT))
    assert dribbled.seen


def test_stream_ending_keeps_the_first_token_apart_from_how_it_ended() -> None:
    aborted = StreamEnding()
    for chunk in (TEXT, ABORT):
        aborted.feed(chunk)
    assert aborted.failure == ENGINE_ABORT and aborted.tokens_emitted
    cut_early = StreamEnding()
    cut_early.feed(ROLE)
    cut_early.cut()
    assert cut_early.failure == CUT and not cut_early.tokens_emitted


def test_in_flight_requests_record_forced_exits_only() -> None:
    heard: list[ForcedExit] = []
    requests = InFlightRequests(heard.append)
    mark = requests.mark()
    normal = requests.begin("r-normal", "/v1/completions", "m")
    streaming = requests.begin("r-stream", "/v1/completions", "m")
    waiting = requests.begin("r-wait", "/v1/chat/completions", "m")
    same_id = requests.begin("r-stream", "/v1/completions", "m")  # a client may reuse an id
    streaming.tokens_emitted = True
    assert requests.end(normal, None) is None
    requests.end(streaming, CUT, "ClientPayloadError")
    requests.end(waiting, ENGINE_ABORT)
    requests.end(streaming, CUT)  # a second end changes nothing
    assert [e.request.request_id for e in heard] == ["r-stream", "r-wait"]
    assert requests.forced == {True: 1, False: 1}
    listed = [e.to_json() for e in requests.forced_since(mark)]
    assert [(e["request_id"], e["tokens_emitted"], e["how"]) for e in listed] == [
        ("r-stream", True, CUT),
        ("r-wait", False, ENGINE_ABORT),
    ]
    assert requests.forced_since(requests.mark()) == []
    assert requests.open() == [same_id]


async def test_a_drain_without_a_gate_says_forced_exits_were_not_observable() -> None:
    listed, more, why = await name_forced_exits(None, 0, lambda line: None)
    assert listed is None and more == 0 and why == NO_GATE and "--gate-port" in why


async def test_a_drain_lists_forced_exits_capped_and_the_requests_still_open() -> None:
    requests = InFlightRequests()
    requests.end(requests.begin("before", "/v1/completions", "m"), CUT)  # before the drain: not its
    mark = requests.mark()
    for i in range(FORCED_EXITS_LISTED + 4):
        requests.end(requests.begin(f"r{i}", "/v1/completions", "m"), CUT)
    hung = requests.begin("hung", "/v1/completions", "m")
    lines: list[str] = []
    named = name_forced_exits(requests, mark, lines.append, settle=0.05)
    listed, more, why = await asyncio.wait_for(named, 30)
    assert listed is not None and why is None
    assert len(listed) == FORCED_EXITS_LISTED and more == 5
    assert listed[0]["request_id"] == "r0" and "before" not in {e["request_id"] for e in listed}
    assert requests.open() == [hung]  # counted as open after exit (beyond the cap here), still open
    assert lines and "105 requests" in lines[0]


async def test_settle_returns_as_soon_as_the_open_requests_end() -> None:
    requests = InFlightRequests()
    entry = requests.begin("r", "/v1/completions", "m")
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, requests.end, entry, CUT)
    assert await asyncio.wait_for(requests.settle(60), 30) == []
    listed, _, _ = await name_forced_exits(requests, 0, lambda line: None)
    assert listed is not None and [e["how"] for e in listed] == [CUT]
    still = requests.begin("s", "/v1/completions", "m")
    assert await requests.settle(0.05) == [still]
    assert OPEN_AFTER_EXIT == "open_after_exit"


def test_gate_metric_counts_forced_exits_by_tokens_emitted() -> None:
    gate = AdmissionGate("http://127.0.0.1:1", lambda: EngineState.READY)
    registry = CollectorRegistry()
    registry.register(AdmissionCollector(gate))
    text = generate_latest(registry).decode()
    assert 'corral_supervisor_forced_exit_requests_total{tokens_emitted="true"} 0.0' in text
    entry = gate.requests.begin("r", "/v1/completions", "m")
    entry.tokens_emitted = True
    gate.requests.end(entry, CUT)
    text = generate_latest(registry).decode()
    assert 'corral_supervisor_forced_exit_requests_total{tokens_emitted="true"} 1.0' in text
    assert 'corral_supervisor_forced_exit_requests_total{tokens_emitted="false"} 0.0' in text
    assert gate.to_json()["forced_exits"] == {"tokens_emitted": 1, "no_tokens": 0}


def test_router_stream_failures_keep_their_series_and_add_the_split() -> None:
    metrics = RouterMetrics()
    metrics.count_stream_failure("m", CUT, tokens_emitted=True)
    metrics.count_stream_failure("m", CUT, tokens_emitted=False)
    registry = CollectorRegistry()
    registry.register(RouterCollector(metrics, lambda: []))
    text = generate_latest(registry).decode()
    assert 'corral_router_stream_failures_total{how="cut",model="m"} 2.0' in text
    for emitted in ("true", "false"):
        labels = f'how="cut",model="m",tokens_emitted="{emitted}"'
        assert f"corral_router_stream_failures_by_tokens_total{{{labels}}} 1.0" in text


class GatedHost:
    """A supervisor as the drain sees it, with a gate whose one open stream the engine's stop cuts."""

    def __init__(self, gated: bool) -> None:
        self.machine = StateMachine(initial=EngineState.SLEEPING, sub_state=None)
        self.routers = RouterSubscriptions(lambda kind, **fields: {}, lambda line: None)
        self.session = None
        self.engine_url = "http://127.0.0.1:1"
        self.drain_settings = DrainSettings()
        self.engine_running = True
        self.gate = InFlightRequests() if gated else None
        self.request_watch = self.gate
        self.open = self.gate.begin("r-cut", "/v1/chat/completions", "m") if self.gate else None

    async def suspend_lifecycle(self) -> None:
        pass

    async def stop_engine(self, grace: float, reason: str) -> int | None:
        if self.gate is not None and self.open is not None:
            self.open.tokens_emitted = True
            self.gate.end(self.open, CUT)  # as the gate sees the engine's connection close
        self.engine_running = False
        return -9


async def test_the_drain_report_names_what_the_stop_cut_and_the_engine_stopped_event_carries_it() -> None:
    host = GatedHost(gated=True)
    report = await DrainSequence(host, lambda line: None).drain_and_stop(DrainPolicy.ABORT)
    assert report.forced_exits is not None and report.forced_exits_unobserved is None
    assert [(e["request_id"], e["tokens_emitted"]) for e in report.forced_exits] == [("r-cut", True)]
    assert host.machine.current.evidence["forced_exits"] == report.forced_exits
    bare = GatedHost(gated=False)
    report = await DrainSequence(bare, lambda line: None).drain_and_stop(DrainPolicy.ABORT)
    assert report.forced_exits is None and report.forced_exits_unobserved == NO_GATE


async def test_the_gate_names_requests_and_records_only_what_the_engine_side_ended() -> None:
    """A gate before a tiny engine on loopback: an id the gate assigns is forwarded and answered with;
    a stream finished with reason abort after a token is a forced exit with tokens_emitted; a whole
    stream is not; and neither is a request the engine refused at connect (it never had it)."""
    seen_ids: list[str] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        seen_ids.append(request.headers.get("x-request-id", ""))
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(TEXT)
        if body.get("prompt") == "abort":
            await resp.write(ABORT)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    engine_app = web.Application()
    engine_app.router.add_post("/v1/completions", completions)
    engine = TestServer(engine_app, host="127.0.0.1")
    await engine.start_server()
    heard: list[ForcedExit] = []
    gate = AdmissionGate(str(engine.make_url("")), lambda: EngineState.READY, on_forced_exit=heard.append)
    front = TestServer(gate.app(), host="127.0.0.1")
    await front.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            url = str(front.make_url("/v1/completions"))
            async with session.post(url, json={"model": "m", "prompt": "whole", "stream": True}) as resp:
                assert resp.status == 200 and (await resp.read()).endswith(b"data: [DONE]\n\n")
                assigned = resp.headers["X-Request-Id"]
            assert seen_ids == [assigned] and len(assigned) == 32 and heard == []
            named = {"x-request-id": "client-7"}
            body = {"model": "m", "prompt": "abort", "stream": True}
            async with session.post(url, json=body, headers=named) as resp:
                await resp.read()
            assert [(e.request.request_id, e.how, e.request.tokens_emitted) for e in heard] == [
                ("client-7", ENGINE_ABORT, True)
            ]
            gone = AdmissionGate("http://127.0.0.1:1", lambda: EngineState.READY, on_forced_exit=heard.append)
            refused = TestServer(gone.app(), host="127.0.0.1")
            await refused.start_server()
            try:
                async with session.post(str(refused.make_url("/v1/completions")), json=body) as resp:
                    assert resp.status == 502
            finally:
                await refused.close()
            assert len(heard) == 1 and gone.requests.forced.total() == 0 and gone.requests.open() == []
    finally:
        await front.close()
        await engine.close()
