"""The admission gate (`corral supervise --gate-port`): the supervisor's data port in front of an engine
bound to loopback. It forwards only the OpenAI inference paths (plus `/v1/models`, `/health` and a
GET of `/metrics`), so the development endpoints that `VLLM_SERVER_DEV_MODE=1` exposes are
unreachable from the data port; it answers 503 with Retry-After unless the engine is READY (or still
leaving routing: a drain's first step, whose quiet period expects what routers sent before they
acknowledged the removal), so nothing reaches an engine out of routing however late a client is;
and it counts in-flight requests
per model or adapter, which makes an adapter's drain exact, and admissions and refusals per model
(`corral.supervisor.http.admission_metrics` shows them on the supervisor's `/metrics`).

Each inference request is tracked by its request id (the client's `X-Request-Id`, which the router
always sends, else one the gate assigns, forwards and answers with) and whether generated tokens have
passed; a stream the engine's side cuts or aborts is a forced exit (`corral.supervisor.http.inflight`).
A cut reaches the gate's client as a cut (the connection closes before the answer's end), never as a
replay or a made-up ending.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Callable
from typing import Any
from uuid import uuid4

import aiohttp
import orjson
from aiohttp import web

from corral.contracts.traffic import RequestCounts
from corral.engine.stream_ending import CUT, ENGINE_ABORT, StreamEnding
from corral.engine_state import EngineState
from corral.openai_errors import error_response
from corral.supervisor.http.inflight import ForcedExitListener, InFlightRequest, InFlightRequests

INFERENCE_PATHS = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/score",
        "/v1/rerank",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/tokenize",
        "/detokenize",
    }
)
READ_PATHS = frozenset({"/v1/models", "/health", "/ping", "/version"})
# GET only: the router's scored policies (prefix, load) scrape the engine's Prometheus metrics, and in
# a rendered pod the gate is their only way in; vLLM's /metrics is read-only and no dev endpoint.
SCRAPE_PATHS = frozenset({"/metrics"})
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "upgrade", "host", "content-length", "te", "trailer"}
)
# why a request was refused: the engine is not READY (503), or the path is not on the data port (404)
NOT_READY = "not_ready"
NOT_SERVED = "path_not_served"
# the router's own rule for an id fit to forward and echo as sent; any other is replaced
_SAFE_REQUEST_ID = re.compile(r"[!-~]{1,200}")


class AdmissionGate:
    def __init__(
        self,
        engine_url: str,
        state: Callable[[], EngineState],
        retry_after: int = 2,
        on_forced_exit: ForcedExitListener | None = None,
        leaving_routing: Callable[[], bool] = lambda: False,
    ) -> None:
        self.engine_url = engine_url.rstrip("/")
        self._state = state
        self._leaving_routing = leaving_routing
        self.retry_after = retry_after
        self.requests = InFlightRequests(on_forced_exit)
        self.in_flight: Counter[str] = Counter()
        self.admitted: Counter[str] = Counter()  # model -> requests forwarded
        self.refused: Counter[tuple[str, str]] = Counter()  # (model, reason) -> requests refused
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def to_json(self) -> dict[str, Any]:
        return {
            "in_flight": dict(self.in_flight),
            "admitted": self.admitted.total(),
            "refused_not_ready": self._refused_for(NOT_READY),
            "refused_path": self._refused_for(NOT_SERVED),
            "forced_exits": {
                "tokens_emitted": self.requests.forced[True],
                "no_tokens": self.requests.forced[False],
            },
        }

    def counts(self) -> RequestCounts:
        """The gate's cumulative counts as request counters (a change record reads them before and
        after): its 503 refusals and its forced exits are failures clients saw; a refused path is the
        client's own error, not counted."""
        refused = self._refused_for(NOT_READY)
        cut = self.requests.forced[True] + self.requests.forced[False]
        admitted = self.admitted.total()
        return RequestCounts(requests=admitted + refused, errors=refused + cut, stream_failures=cut)

    def _admitting(self) -> bool:
        """READY, or DRAINING while routers may still send here (their requests in dispatch before
        the acknowledgement reach the engine, which still serves, as they would without a gate)."""
        return self._state() is EngineState.READY or self._leaving_routing()

    def _refused_for(self, reason: str) -> int:
        return sum(n for (_, why), n in self.refused.items() if why == reason)

    async def wait_idle(self, model: str, within: float) -> bool:
        """True once no request for `model` is in flight through the gate, False after `within` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while self.in_flight.get(model, 0) > 0:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        scrape = path in SCRAPE_PATHS and request.method == "GET"
        if path not in INFERENCE_PATHS and path not in READ_PATHS and not scrape:
            self.refused[("", NOT_SERVED)] += 1  # no body read for a path nobody may reach
            return error_response(404, f"{path} is not served on the data port", "NotFoundError")
        body = await request.read()
        model = _model_of(body) if path in INFERENCE_PATHS else None
        if path in INFERENCE_PATHS and not self._admitting():
            self.refused[(model or "", NOT_READY)] += 1
            answer = error_response(
                503,
                f"the engine is {self._state()}, not READY; retry after {self.retry_after} s",
                "ServiceUnavailableError",
            )
            answer.headers["Retry-After"] = str(self.retry_after)
            return answer
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        if path not in INFERENCE_PATHS:
            return await self._forward(request, body, headers, None)
        request_id = request.headers.get("x-request-id", "")
        assigned = _SAFE_REQUEST_ID.fullmatch(request_id) is None
        if assigned:
            request_id = uuid4().hex
            headers = {k: v for k, v in headers.items() if k.lower() != "x-request-id"}
            headers["X-Request-Id"] = request_id
        if model is not None:
            self.in_flight[model] += 1
            self.admitted[model] += 1
        entry = self.requests.begin(request_id, path, model)
        try:
            return await self._forward(request, body, headers, entry, echo_id=assigned)
        finally:
            if model is not None:
                self.in_flight[model] -= 1
                if self.in_flight[model] <= 0:
                    del self.in_flight[model]
            self.requests.end(entry, None)  # its client left (or it ended already: nothing happens)

    async def _forward(
        self,
        request: web.Request,
        body: bytes,
        headers: dict[str, str],
        entry: InFlightRequest | None,
        echo_id: bool = False,
    ) -> web.StreamResponse:
        """Relay the engine's answer as it comes; `entry` (an inference request) learns whether tokens
        passed and, at the end, whether the engine's side cut or aborted it."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5), auto_decompress=False
            )
        try:
            upstream = await self._session.request(
                request.method, self.engine_url + request.path_qs, data=body or None, headers=headers
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            # refused at connect: the engine never had it; anything later was cut in the engine's hands
            if entry is not None:
                self.requests.end(entry, None if isinstance(exc, aiohttp.ClientConnectorError) else CUT, why)
            return error_response(502, f"engine not answering: {why}", "BadGateway")
        async with upstream:
            answer_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            if echo_id and entry is not None and "x-request-id" not in {k.lower() for k in answer_headers}:
                answer_headers["X-Request-Id"] = entry.request_id
            resp = web.StreamResponse(status=upstream.status, headers=answer_headers)
            streaming = upstream.content_type == "text/event-stream"
            ending = StreamEnding() if streaming and entry is not None else None
            await resp.prepare(request)
            while True:
                try:
                    chunk = await upstream.content.readany()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    if entry is not None:
                        self.requests.end(entry, CUT, f"{type(exc).__name__}: {exc}")
                    # the answer stays unfinished for the gate's client too: closed, never ended cleanly
                    if request.transport is not None:
                        request.transport.close()
                    return resp
                if not chunk:
                    break
                if entry is not None:
                    if ending is not None:
                        ending.feed(chunk)
                        entry.tokens_emitted = ending.tokens_emitted
                    else:
                        entry.tokens_emitted = upstream.status < 300
                await resp.write(chunk)  # a client gone raises here: its own exit, not a forced one
            if entry is not None:
                aborted = ending is not None and ending.failure == ENGINE_ABORT
                self.requests.end(entry, ENGINE_ABORT if aborted else None)
            await resp.write_eof()
            return resp


def _model_of(body: bytes) -> str | None:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    model = payload.get("model") if isinstance(payload, dict) else None
    return model if isinstance(model, str) else "(default)"
