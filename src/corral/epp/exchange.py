"""One ext_proc stream, which is one HTTP request through the gateway: its headers, its body read whole
(bounded) for the model, the prompt and `stream`, the pick answered as the protocol asks, then the
response phases fed to the request's `Flight`.

Body modes: FULL_DUPLEX_STREAMED, the protocol's (the headers' answer waits for the body's end, and the
body is handed back in chunks), and BUFFERED (the headers go on at once, the pick rides on the body's
answer). With no body to read (NONE, STREAMED, a request without a body) the pick is made on the
headers alone."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from corral.epp import wire
from corral.epp.decision import Pick, Picker, Refusal, refusal
from corral.epp.flight import Flight
from corral.router.telemetry.metrics import RouterMetrics

log = logging.getLogger("corral.epp")

_MODE = processing_mode_pb2.ProcessingMode
FULL_DUPLEX = _MODE.FULL_DUPLEX_STREAMED
BUFFERED = (_MODE.BUFFERED, _MODE.BUFFERED_PARTIAL)


class Exchange:
    def __init__(self, picker: Picker, metrics: RouterMetrics, max_body_bytes: int) -> None:
        self._picker = picker
        self._metrics = metrics
        self._max_body = max_body_bytes
        self.flight: Flight | None = None

    async def run(
        self, requests: AsyncIterator[ext_proc.ProcessingRequest]
    ) -> AsyncIterator[ext_proc.ProcessingResponse]:
        start = time.perf_counter()
        request_mode = response_mode = FULL_DUPLEX  # the protocol's, unless the gateway says otherwise
        headers: dict[str, str] = {}
        subset: frozenset[str] | None = None
        body = bytearray()
        try:
            async for message in requests:
                kind = message.WhichOneof("request")
                if message.HasField("protocol_config"):
                    request_mode = message.protocol_config.request_body_mode
                    response_mode = message.protocol_config.response_body_mode
                if kind == "request_headers":
                    try:
                        headers = wire.read_headers(message.request_headers)
                        subset = wire.subset_hint(message)
                    except wire.WireError as exc:
                        log.warning("refused a request from the gateway: %s", exc)
                        yield self._refuse(refusal(400, f"The gateway's request: {exc}.", "BadRequestError"))
                        return
                    if message.request_headers.end_of_stream or not (
                        request_mode == FULL_DUPLEX or request_mode in BUFFERED
                    ):
                        answer = self._decide(headers, b"", subset, start, "request_headers")
                        yield answer
                        if answer.HasField("immediate_response"):
                            return
                    elif request_mode in BUFFERED:
                        yield wire.headers_continue("request_headers")
                elif kind == "request_body":
                    chunk = message.request_body
                    if self.flight is not None:  # picked on the headers: the body goes as it comes
                        for part in _body_answer(
                            "request_body", chunk.body, chunk.end_of_stream, request_mode
                        ):
                            yield part
                        continue
                    if len(body) + len(chunk.body) > self._max_body:
                        yield self._refuse(
                            refusal(
                                413,
                                f"The request body is over the {self._max_body} bytes the endpoint picker "
                                "reads; send a smaller one.",
                                "BadRequestError",
                                "body",
                            )
                        )
                        return
                    body += chunk.body
                    if not chunk.end_of_stream:
                        continue
                    if request_mode in BUFFERED:
                        answer = self._decide(headers, bytes(body), subset, start, "request_body")
                        yield answer
                        if answer.HasField("immediate_response"):
                            return
                        continue
                    answer = self._decide(headers, bytes(body), subset, start, "request_headers")
                    yield answer
                    if answer.HasField("immediate_response"):
                        return
                    for part in wire.body_chunks("request_body", bytes(body), True):
                        yield part
                    body = bytearray()
                elif kind == "request_trailers":
                    yield ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse())
                elif kind == "response_headers":
                    yield self._response_headers(message)
                elif kind == "response_body":
                    chunk = message.response_body
                    if self.flight is not None:
                        self.flight.body(chunk.body)
                        if chunk.end_of_stream:
                            self.flight.end()
                    for part in _body_answer("response_body", chunk.body, chunk.end_of_stream, response_mode):
                        yield part
                elif kind == "response_trailers":
                    if self.flight is not None:
                        self.flight.end()
                    yield ext_proc.ProcessingResponse(response_trailers=ext_proc.TrailersResponse())
        finally:
            if self.flight is not None:
                self.flight.release()

    def _decide(
        self,
        headers: dict[str, str],
        body: bytes,
        subset: frozenset[str] | None,
        start: float,
        phase: str,
    ) -> ext_proc.ProcessingResponse:
        path = headers.get(":path", "").partition("?")[0]
        decided = self._picker.decide(headers, body, path, subset)
        if isinstance(decided, Refusal):
            return self._refuse(decided)
        self.flight = Flight(decided, self._metrics, start)
        return wire.picked(self._addresses(decided), self._set_headers(decided, body), self._removed(), phase)

    def _addresses(self, pick: Pick) -> list[str]:
        return [self._picker.address(e) for e in (pick.endpoint, *pick.fallbacks)]

    def _set_headers(self, pick: Pick, body: bytes) -> dict[str, str]:
        extra: dict[str, str] = {}
        if body:  # handed back whole: its length is known (llm-d sets it too)
            extra["content-length"] = str(len(body))
        if pick.prefill is not None:
            extra[wire.PREFILL_HEADER] = self._picker.address(pick.prefill)
        return extra

    def _removed(self) -> list[str]:
        # a tenant's key is Corral's, never the engine's (as the router drops it)
        return ["authorization"] if self._picker.gate is not None else []

    def _refuse(self, answer: Refusal) -> ext_proc.ProcessingResponse:
        self._metrics.count_request("", answer.status)
        return wire.immediate(answer.status, answer.body, answer.headers)

    def _response_headers(self, message: ext_proc.ProcessingRequest) -> ext_proc.ProcessingResponse:
        flight = self.flight
        if flight is not None:
            served = wire.served_endpoint(message)
            if served is not None and served != self._picker.address(flight.endpoint):  # a fallback served
                endpoint = self._picker.by_address(served)
                if endpoint is not None:
                    flight.served_by(endpoint)
            try:
                headers = wire.read_headers(message.response_headers)
            except wire.WireError as exc:
                log.warning("response headers from the gateway not read: %s", exc)
                headers = {}
            flight.answered(_status(headers.get(":status", "")), headers.get("content-type", ""))
            if message.response_headers.end_of_stream:
                flight.end()
        return wire.headers_continue("response_headers")


def _body_answer(
    phase: str, chunk: bytes, end_of_stream: bool, mode: int
) -> Iterator[ext_proc.ProcessingResponse]:
    """A body chunk handed back (full duplex: the gateway forwards only what the picker returns), or
    let go on unchanged (buffered)."""
    if mode == FULL_DUPLEX:
        return wire.body_chunks(phase, chunk, end_of_stream)
    return iter((wire.body_continue(phase),))


def _status(text: str) -> int:
    """An HTTP status from `:status`: three digits, else 0 (unknown)."""
    return int(text) if len(text) == 3 and text.isdigit() else 0
