"""The data path: forward one OpenAI request to one eligible endpoint and relay the answer.

The body is parsed once, only to read `model`; the original bytes go upstream, unless the client sent
`kv_transfer_params` (the router's alone, corral.router.datapath.transfer_params): then the body less that
key goes. Answers are relayed as they come (SSE chunk by chunk, no buffering but an unfinished line; a
whole answer up to MAX_ANSWER_BYTES), with any params they carry set to null. A connection failure or a silent
backend before any byte reached the client ejects that endpoint and retries on another, as long
as the retry budget allows (retries at most a fraction of recent requests, plus a floor); after
the first byte nothing is replayed and the client's stream ends with an SSE error event. A client's error
names no engine, address or exception: it says what failed and the request id, and the router's log has
the rest in one WARNING line under that id.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from corral.engine.stream_ending import StreamEnding
from corral.openai_errors import sse_error_event
from corral.router.datapath.dispatch import Dispatch
from corral.router.datapath.exchange import Answer, ClientReply, ClientRequest, Headers, error_answer
from corral.router.datapath.pd import Disaggregation, NoPair, PrefillLeg
from corral.router.datapath.request_ids import RequestIds
from corral.router.datapath.retry_budget import RetryBudget, RetryBudgetConfig
from corral.router.datapath.transfer_params import (
    MAX_ANSWER_BYTES,
    AnswerTooLarge,
    SseParamsFilter,
    UnstrippableStream,
    strip_answer,
    strip_request,
)
from corral.router.datapath.upstream import (
    UPSTREAM_FAILURES,
    EngineAbandoned,
    UpstreamClient,
    UpstreamResponse,
    describe_failure,
)
from corral.router.datapath.wake_on_demand import WakeOnDemand
from corral.router.flow.gate import Admission, FlowGate
from corral.router.flow.refusal import Refusal
from corral.router.flow.request_class import RequestClass
from corral.router.membership.endpoint import Endpoint
from corral.router.membership.membership import Membership
from corral.router.routing.policies import LeastRequest
from corral.router.routing.request import Policy, RouteRequest
from corral.router.telemetry.metrics import RouterMetrics
from corral.router.telemetry.request_trace import RequestTrace, RequestTracer
from corral.router.telemetry.traffic import StreamTimes

log = logging.getLogger("corral.router.proxy")

# Headers that describe one hop, not the message; never copied across the proxy (nor those the
# message's own Connection header names). `Expect: 100-continue` is one: the router's server has
# already answered the 100, and an engine's 100 must not be mistaken for its answer.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "expect",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
RESPONSE_SKIP = HOP_BY_HOP | {"server", "date", "x-request-id"}
# What else a request loses on its way upstream, by (the router names the request, the router sets
# or drops Authorization): the client's X-Request-Id is replaced, its Authorization dropped.
_REQUEST_SKIP = {
    (renamed, reauthorized): HOP_BY_HOP
    | ({"x-request-id"} if renamed else set())
    | ({"authorization"} if reauthorized else set())
    for renamed in (False, True)
    for reauthorized in (False, True)
}

# An X-Request-Id the router forwards and echoes as the client sent it; any other gets the router's own.
_SAFE_REQUEST_ID = re.compile(r"[!-~]{1,200}")

CLIENT_CLOSED = 499  # nginx's code for "client closed the request", used only in metrics


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyConfig:
    max_retries: int = 2
    eject_seconds: float = 5.0
    retry_after_seconds: float = 5.0
    retry_budget: RetryBudgetConfig = field(default_factory=RetryBudgetConfig)


class Proxy:
    wake_on_demand: WakeOnDemand | None = None  # set by the app with --wake-hold-seconds (scale from zero)
    # The client's Authorization goes upstream only on an open router with no engine key: a tenant's
    # key (--api-keys-file) is the router's, and --engine-api-key-file sends the engine's own instead.
    # Set exactly when the router has tenants.
    drop_client_authorization = False
    engine_authorization: str | None = None  # "Bearer <engine key>"
    flow: FlowGate | None = None  # set by the app with --flow-control
    tracer: RequestTracer | None = None  # set by the app when traces are exported (corral.tracing)

    def __init__(
        self,
        membership: Membership,
        policy: Policy,
        upstream: UpstreamClient,
        metrics: RouterMetrics,
        config: ProxyConfig,
        decode_policy: Policy | None = None,
    ) -> None:
        self._membership = membership
        self._policy = policy
        self._upstream = upstream
        self._metrics = metrics
        self._config = config
        self._budget = RetryBudget(config.retry_budget)
        self._ids = RequestIds()
        # Prefill/decode disaggregation: the prefill leg picked by `policy`, the decode leg by
        # `decode_policy` (load-aware; least request when none is given).
        self._pd = Disaggregation(
            membership,
            policy,
            decode_policy if decode_policy is not None else LeastRequest(),
            upstream,
            metrics,
            self._budget,
            config.max_retries,
            self._eject,
        )
        membership.failure_listeners.append(self._abandon)

    def _abandon(self, endpoint: Endpoint, verdict: str) -> None:
        """The router has just judged `endpoint` failed: every request out there fails now, its
        connection closed, instead of waiting for the client's timeout. `_forward` retries those that
        had sent the client nothing (once, within the retry budget); `_relay` ends the others."""
        count = self._upstream.abandon(endpoint.url, verdict)
        if count:
            log.warning(
                "judged %s failed (%s): abandoning its %d requests in flight; those that sent the client "
                "nothing go to another engine",
                endpoint.url,
                verdict,
                count,
            )

    async def handle(self, request: ClientRequest, reply: ClientReply) -> int:
        """Answer one request through `reply`; returns the status the client was answered."""
        if self.tracer is None:
            return await self._handle(request, reply, None)
        trace = self.tracer.begin(request.method, request.path, request.headers)
        status = CLIENT_CLOSED
        try:
            status = await self._handle(request, reply, trace)
        finally:
            trace.end(status)
        return status

    async def _handle(self, request: ClientRequest, reply: ClientReply, trace: RequestTrace | None) -> int:
        start = time.perf_counter()
        body = await request.read()
        request_id = request.headers.get("x-request-id", "")
        own_id = _SAFE_REQUEST_ID.fullmatch(request_id) is not None
        if not own_id:
            request_id = self._ids.new()  # none, or one not fit to echo: the router names the request
        reauthorized = self.drop_client_authorization or self.engine_authorization is not None
        upstream_headers, problem = _forwarded_headers(request, _REQUEST_SKIP[not own_id, reauthorized])
        model: str | None = None
        payload: dict[str, Any] | None = None
        if problem is None:
            model, payload, problem = self._model_of(request, body, request_id)
        if problem is not None:
            return await self._reject(reply, problem, model or "", request_id, start)
        assert model is not None
        if payload is not None and strip_request(payload):
            body = orjson.dumps(payload)  # only the router's own P/D legs set kv_transfer_params
        if self.wake_on_demand is not None:
            waited = await self.wake_on_demand.hold(model)
            if waited is not None:  # scale from zero's 503 at once (--wake-mode reject, or the hold full)
                return await self._reject(
                    reply, self._unavailable(model, waited, request_id), model, request_id, start
                )

        if not own_id:
            upstream_headers.append(("X-Request-Id", request_id))
        if self.engine_authorization is not None:
            upstream_headers.append(("Authorization", self.engine_authorization))
        route = RouteRequest(model, request.headers, payload)
        self._budget.record_request(time.monotonic())
        if trace is not None:
            trace.named(model, request_id)
        flow = self.flow
        admission: Admission | None = None
        try:
            let_out = False
            if flow is not None:  # held while every engine of the model is saturated (corral.router.flow)
                admitted = flow.admit_now(
                    model, request.headers, request.tenant if self.drop_client_authorization else None
                )
                if isinstance(admitted, RequestClass):  # every engine saturated, or others wait first
                    admitted = await flow.wait(model, admitted)
                if isinstance(admitted, Refusal):
                    answer = error_answer(
                        admitted.status,
                        admitted.message,
                        admitted.err_type,
                        admitted.param,
                        admitted.headers(),
                    )
                    return await self._reject(reply, answer, model, request_id, start)
                admission = admitted
                let_out = admitted.waited  # no await from here to the engine's in-flight count
            return await self._forward(
                request, reply, body, upstream_headers, route, request_id, start, trace, let_out=let_out
            )
        except asyncio.CancelledError:
            self._metrics.count_request(model, CLIENT_CLOSED)
            raise
        finally:
            if flow is not None:
                flow.finished(model, admission)

    # -- request checks ---------------------------------------------------------------------

    def _model_of(
        self, request: ClientRequest, body: bytes, request_id: str
    ) -> tuple[str | None, dict[str, Any] | None, Answer | None]:
        """The model to route by and the parsed body (policies read the prompt from it), or the error
        answer that ends the request here."""
        model: object = None
        payload: dict[str, Any] | None = None
        content_type = request.headers.get("Content-Type")
        if content_type is None or content_type.lstrip()[:10].lower() != "multipart/":
            if not body:
                return None, payload, _bad_request("The request body is empty; send a JSON object.", "body")
            try:
                parsed = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                return None, payload, _bad_request(f"The request body is not valid JSON: {exc}", "body")
            if not isinstance(parsed, dict):
                return None, payload, _bad_request("The request body must be a JSON object.", "body")
            payload = parsed
            model = parsed.get("model")
        membership = self._membership
        # a tenant sees only its `models`; any other is unknown to it (an open router has no tenants,
        # and asking the request for one that is not there costs a KeyError)
        tenant = request.tenant if self.drop_client_authorization else None
        if model is None:
            known = [m for m in membership.known_models() if tenant is None or tenant.serves(m)]
            if len(known) == 1:
                return known[0], payload, None  # vLLM serves its only model when none is named
            if not known:
                return None, payload, self._unavailable("", "no endpoint has answered yet", request_id)
            return (
                None,
                payload,
                _bad_request(
                    f"The request names no `model` and the fleet serves {len(known)}: "
                    f"{', '.join(sorted(known))}. Name one.",
                    "model",
                ),
            )
        if not isinstance(model, str):
            return None, payload, _bad_request("`model` must be a string.", "model")
        hidden = tenant is not None and not tenant.serves(model)
        if hidden or not membership.knows(model):
            if not membership.known_models():
                return model, payload, self._unavailable(model, "no endpoint has answered yet", request_id)
            if tenant is not None and hidden:
                tenant.reject("model")
            return (
                model,
                payload,
                error_answer(404, f"The model `{model}` does not exist.", "NotFoundError", "model"),
            )
        return model, payload, None

    def _unavailable(self, model: str, why: str, request_id: str) -> Answer:
        """The client's 503: `why` must name no engine, address or exception (the log has those)."""
        retry_after = self._membership.retry_after(model, self._config.retry_after_seconds)
        what = f"model `{model}`" if model else "this request"
        return error_answer(
            503,
            f"No engine could serve {what} right now: {why}; retry after {retry_after} s "
            f"(request {request_id}).",
            "ServiceUnavailableError",
            headers={"Retry-After": str(retry_after)},
        )

    def _gave_up(self, model: str, why: str, detail: str, request_id: str) -> Answer:
        """The 503 for a request no engine served: `detail` (engines, addresses, errors) goes to the log
        in one WARNING line under the request id, `why` (words only) to the client."""
        log.warning("request %s: no engine served model %s: %s", request_id, model, detail)
        return self._unavailable(model, why, request_id)

    async def _reject(
        self, reply: ClientReply, answer: Answer, model: str, request_id: str, start: float
    ) -> int:
        answer.headers.append(("X-Request-Id", request_id))
        metrics = self._metrics
        metrics.count_request(model if self._membership.knows(model) else "", answer.status)
        if answer.status >= 500:
            metrics.errors += 1
        metrics.duration.observe(time.perf_counter() - start)
        await reply.send(answer)
        return answer.status

    # -- forwarding -------------------------------------------------------------------------

    async def _forward(
        self,
        request: ClientRequest,
        reply: ClientReply,
        body: bytes,
        upstream_headers: Headers,
        route: RouteRequest,
        request_id: str,
        start: float,
        trace: RequestTrace | None,
        *,
        let_out: bool = False,
    ) -> int:
        metrics = self._metrics
        model = route.model
        attempt = 0
        retried_abandoned = False  # an abandoned request is retried once (`_abandon`)
        failures: list[str] = []  # for the log only: they name engines and errors
        pd = self._pd
        disaggregated = pd.applies(route, request.path)
        while True:
            # P/D: a (fresh) prefill leg first; the decode leg then goes as any request goes.
            leg: PrefillLeg | None = None
            if disaggregated:
                leg_headers = upstream_headers if trace is None else trace.prefill_leg(upstream_headers)
                got = await pd.prefill(request.method, request.raw_path, leg_headers, route, request_id)
                if trace is not None:
                    trace.prefill_done(*_prefill_outcome(got))
                if not isinstance(got, PrefillLeg):
                    answer = (
                        got
                        if isinstance(got, Answer)
                        else self._gave_up(model, got.public, "; ".join([*failures, got.why]), request_id)
                    )
                    return await self._reject(reply, answer, model, request_id, start)
                leg, candidates, policy, sent = got, got.decoders, pd.decode_policy, got.body
            else:
                candidates, policy, sent = self._membership.eligible(model), self._policy, body
                if let_out and not attempt and self.flow is not None:  # out of the flow queue: to room
                    candidates = self.flow.with_room(candidates)
            if not candidates:
                answer = (
                    self._gave_up(model, _tried(attempt), "; ".join(failures), request_id)
                    if failures
                    else self._unavailable(model, "no endpoint of it is READY", request_id)
                )
                return await self._reject(reply, answer, model, request_id, start)
            route.prefill_tokens, route.expected_hit = 0, None
            endpoint = policy.pick(candidates, route)
            if leg is not None:
                pd.paired(leg, endpoint)
            dispatched = time.monotonic()  # the endpoint's own latencies count from here, not `start`
            dispatch = Dispatch(endpoint, route.prefill_tokens)  # in its prefill queue until the first byte
            upstream: UpstreamResponse | None = None
            sent_headers = upstream_headers
            if trace is not None:
                sent_headers = trace.attempt(
                    endpoint,
                    policy.name,
                    len(candidates),
                    route,
                    upstream_headers,
                    leg.prefill if leg is not None else None,
                )
            try:
                # Everything up to the first byte for the client may be retried elsewhere.
                try:
                    upstream = await self._upstream.request(
                        endpoint.url, request.method, request.raw_path, sent_headers, sent
                    )
                    dispatch.answered(upstream)
                    streaming = upstream.content_type == "text/event-stream"
                    first = await upstream.readany() if streaming else await upstream.read(MAX_ANSWER_BYTES)
                    dispatch.first_byte()
                except UPSTREAM_FAILURES as exc:
                    endpoint.traffic.ended(failed=True)  # against this endpoint, retried or not
                    failure = f"{endpoint.url}: {describe_failure(exc)}"
                    failures.append(failure)
                    if trace is not None:
                        trace.attempt_failed(describe_failure(exc))
                    if leg is not None:
                        pd.decode_failed(leg)  # retried with a fresh prefill: this transfer may be gone
                    abandoned = isinstance(exc, EngineAbandoned)
                    if not abandoned:  # a judged engine is out of routing already, and earns its way back
                        self._eject(endpoint, failure, request_id, attempt)
                    if attempt < self._config.max_retries and not (abandoned and retried_abandoned):
                        if self._budget.try_spend(time.monotonic()):
                            attempt += 1
                            metrics.retries += 1
                            if abandoned:
                                retried_abandoned = True
                                metrics.count_abandoned("retried")
                            continue
                        metrics.retry_budget_exhausted += 1
                        failures.append("retry budget spent, not retried")
                    if abandoned:
                        metrics.count_abandoned("not_retried")
                    answer = self._gave_up(model, _tried(attempt), "; ".join(failures), request_id)
                    return await self._reject(reply, answer, model, request_id, start)
                except AnswerTooLarge as exc:
                    endpoint.traffic.ended(failed=True)
                    if leg is not None:
                        pd.decode_failed(leg)
                    log.warning(
                        "request %s: %s answered %d with a body over %d bytes; not relayed",
                        request_id,
                        endpoint.url,
                        upstream.status if upstream is not None else 0,
                        exc.limit,
                    )
                    answer = error_answer(
                        502,
                        f"The engine's answer was larger than the {exc.limit} bytes the router relays "
                        f"whole; ask for `stream: true` to receive it as it is generated (request "
                        f"{request_id}).",
                        "BadGatewayError",
                    )
                    return await self._reject(reply, answer, model, request_id, start)
                endpoint.record_success()
                status = upstream.status
                if trace is not None:
                    trace.answered(status, time.monotonic() - dispatched)
                if leg is not None:
                    pd.decode_answered(leg, status, dispatched)
                    # a whole 5xx answer (a failed KV load) has reached no client yet: fresh prefill
                    if status >= 500 and not streaming and attempt < self._config.max_retries:
                        if self._budget.try_spend(time.monotonic()):
                            endpoint.traffic.ended(failed=True)
                            failures.append(f"decode {endpoint.url} answered {status}")
                            if trace is not None:
                                trace.attempt_failed(f"decode leg answered {status}")
                            log.warning("request %s: %s; a fresh prefill", request_id, failures[-1])
                            attempt += 1
                            metrics.retries += 1
                            continue
                        metrics.retry_budget_exhausted += 1
                headers = _response_headers(upstream, request_id)
                if not streaming:
                    metrics.count_request(model, status)
                    if status >= 500:
                        metrics.errors += 1
                    endpoint.traffic.ended(failed=status >= 500)
                    if status < 400:
                        endpoint.traffic.first_token(
                            time.monotonic() - dispatched, dispatched, endpoint.routable_from
                        )
                        if route.expected_hit is not None:  # what the engine's cache served
                            route.expected_hit.answered(first)
                    elapsed = time.perf_counter() - start
                    metrics.ttft.observe(elapsed)
                    metrics.duration.observe(elapsed)
                    if trace is not None:
                        trace.usage(first)
                    await reply.send(Answer(status, strip_answer(first), headers))
                    return status
                return await self._relay(
                    reply,
                    upstream,
                    first,
                    status,
                    headers,
                    endpoint,
                    route,
                    request_id,
                    attempt,
                    start,
                    dispatched,
                    trace,
                )
            finally:
                dispatch.release()
                if leg is not None:
                    pd.release(leg)

    async def _relay(
        self,
        reply: ClientReply,
        upstream: UpstreamResponse,
        first: bytes,
        status: int,
        headers: Headers,
        endpoint: Endpoint,
        route: RouteRequest,
        request_id: str,
        attempt: int,
        start: float,
        dispatched: float,
        trace: RequestTrace | None = None,
    ) -> int:
        """Relay an SSE answer chunk by chunk; a failure now can only end the client's stream."""
        metrics = self._metrics
        ending = StreamEnding()
        ending.feed(first)
        times = StreamTimes(endpoint.traffic, dispatched, endpoint.routable_from)
        times.feed(first, ending.tokens_emitted)
        params = SseParamsFilter()
        before, last = b"", first  # the stream's last two reads: its usage event is among them
        await reply.start(status, headers)
        code = status
        content = upstream
        try:
            await reply.write(params.feed(first))
            metrics.ttft.observe(time.perf_counter() - start)
            while True:
                try:
                    chunk = await content.readany()
                except UPSTREAM_FAILURES as exc:
                    why = f"{endpoint.url}: {describe_failure(exc)}"
                    log.warning(
                        "request %s attempt %d: stream from %s cut after the first byte (%s), tokens "
                        "emitted: %s; ending the client's stream with an error event, not replaying it",
                        request_id,
                        attempt,
                        endpoint.url,
                        why,
                        "true" if ending.tokens_emitted else "false",
                    )
                    abandoned = isinstance(exc, EngineAbandoned)
                    if abandoned:
                        metrics.count_abandoned("ended")
                    else:
                        self._eject(endpoint, why, request_id, attempt)
                    metrics.errors += 1
                    ending.cut()
                    code = 502
                    await reply.write(params.finish())
                    message = (
                        f"The router judged the engine serving this stream failed (it stopped answering "
                        f"or its supervisor failed it) and ended the stream; request {request_id} was "
                        "not replayed."
                        if abandoned
                        else f"The engine serving this stream failed mid-stream; request {request_id} "
                        "was not replayed."
                    )
                    await reply.write(sse_error_event(message, "BadGatewayError", 502))
                    break
                if not chunk:
                    await reply.write(params.finish())
                    if route.expected_hit is not None:  # the usage event, when the client asked for it
                        route.expected_hit.answered(before + last)
                    break
                before, last = last, chunk
                ending.feed(chunk)
                times.feed(chunk, ending.tokens_emitted)
                await reply.write(params.feed(chunk))
        except UnstrippableStream as exc:
            log.warning("request %s: stream from %s ended by the router: %s", request_id, endpoint.url, exc)
            metrics.errors += 1
            ending.cut()
            code = 502
            await reply.write(
                sse_error_event(
                    f"The engine serving this stream sent an event the router does not relay; request "
                    f"{request_id} was ended here.",
                    "BadGatewayError",
                    502,
                )
            )
        endpoint.traffic.ended(failed=ending.failure is not None or code >= 500)
        if trace is not None:
            trace.usage(before + last)
            if ending.failure is not None:
                trace.attempt_failed(f"stream ended: {ending.failure}")
        await reply.finish()
        if ending.failure is not None:
            metrics.count_stream_failure(route.model, ending.failure, ending.tokens_emitted)
        metrics.count_request(route.model, code)
        metrics.duration.observe(time.perf_counter() - start)
        return status

    def _eject(self, endpoint: Endpoint, why: str, request_id: str, attempt: int) -> None:
        seconds = endpoint.eject(time.monotonic(), self._config.eject_seconds)
        if seconds is not None:
            self._metrics.ejections += 1
            log.warning(
                "ejected %s for %.1f s after request %s attempt %d failed: %s",
                endpoint.url,
                seconds,
                request_id,
                attempt,
                why,
            )


def _forwarded_headers(request: ClientRequest, skip: frozenset[str]) -> tuple[Headers, Answer | None]:
    """The client's headers less the hop-by-hop ones and `skip`, or the 400 for one that cannot be
    forwarded.

    The request head goes upstream as latin-1, and the client's bytes arrive here decoded as UTF-8:
    a value outside ASCII would reach the engine as other bytes than the client sent, or not at all.
    """
    headers = request.headers
    connection = headers.get("connection")
    if connection and connection.lower() not in ("keep-alive", "close"):
        skip = skip | {token.strip().lower() for token in connection.split(",")}
    forwarded = [(k, v) for k, v in headers.items() if k.lower() not in skip]
    if not "".join(headers.values()).isascii():
        name, value = next((k, v) for k, v in headers.items() if not v.isascii())
        at = next(i for i, char in enumerate(value) if not char.isascii())
        return forwarded, _bad_request(
            f"The header `{name.lower()}` has a character outside ASCII at position {at} of its "
            "value; HTTP header values must be ASCII (percent-encode or base64-encode the value).",
            name.lower(),
        )
    target = request.raw_path
    if not target.startswith("/") or not target.isascii():
        # absolute-form (`POST http://host/v1/...`) would reach the engine naming another host
        return forwarded, _bad_request(
            "The request target must be a path starting with `/` (origin-form), in ASCII; "
            "send `POST /v1/...` with a Host header.",
            "path",
        )
    return forwarded, None


def _response_headers(upstream: UpstreamResponse, request_id: str) -> Headers:
    headers = [(k, v) for k, v in upstream.headers if k.lower() not in RESPONSE_SKIP]
    headers.append(("X-Request-Id", request_id))
    return headers


def _prefill_outcome(got: PrefillLeg | NoPair | Answer) -> tuple[Endpoint | None, str]:
    """What a P/D prefill leg's span records: the engine that answered, or how the leg ended."""
    if isinstance(got, PrefillLeg):
        return got.prefill, "answered"
    if isinstance(got, Answer):
        return None, f"answered {got.status}"
    return None, "no pair"


def _tried(attempts: int) -> str:
    tried = attempts + 1
    return f"{tried} {'engine' if tried == 1 else 'engines'} tried, all failed"


def _bad_request(message: str, param: str | None) -> Answer:
    return error_answer(400, message, "Bad Request", param)
