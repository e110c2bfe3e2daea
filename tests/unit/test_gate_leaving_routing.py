"""The admission gate while a drain leaves routing: a request a router sent before it acknowledged the
removal reaches the engine (which still serves, as it would without a gate), and only after that
phase, or in any other state than READY, is inference refused with 503."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from corral.supervisor.http.admission import AdmissionGate
from corral.supervisor.lifecycle.states import EngineState


async def _status(gate: AdmissionGate) -> int:
    front = TestServer(gate.app(), host="127.0.0.1")
    await front.start_server()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(str(front.make_url("/v1/completions")), json={"model": "m", "prompt": "x"}) as resp,
        ):
            await resp.read()
            return resp.status
    finally:
        await front.close()


async def test_inference_passes_while_leaving_routing_and_is_refused_after() -> None:
    async def completions(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"text": "ok", "finish_reason": "stop"}]})

    engine_app = web.Application()
    engine_app.router.add_post("/v1/completions", completions)
    engine = TestServer(engine_app, host="127.0.0.1")
    await engine.start_server()
    url = str(engine.make_url(""))
    try:
        state, leaving = EngineState.DRAINING, True
        gate = AdmissionGate(url, lambda: state, leaving_routing=lambda: leaving)
        assert await _status(gate) == 200
        leaving = False  # the drain waits for in-flight requests now: a late one is refused
        assert await _status(gate) == 503
        assert gate.to_json()["refused_not_ready"] == 1 and gate.to_json()["admitted"] == 1
        state = EngineState.SLEEPING
        assert await _status(gate) == 503
        # without the callable (the default) only READY passes
        assert await _status(AdmissionGate(url, lambda: EngineState.DRAINING)) == 503
        assert await _status(AdmissionGate(url, lambda: EngineState.READY)) == 200
    finally:
        await engine.close()
