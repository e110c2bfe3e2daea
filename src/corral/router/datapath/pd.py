"""Prefill/decode disaggregation on the data path: for a model whose endpoints have roles, pick a prefill
engine (the model's own policy: the prompt's prefix lives there), run the prefill leg to its whole answer,
and hand the proxy the decode leg — the client's body carrying the answer's `kv_transfer_params`, and the
decode endpoints compatible with that prefill engine (`Membership.compatible_decode`). With a storage
connector (`pd_protocol.STORAGE_CONNECTORS`: the prefill engine saved the prompt's KV where the decode engine
finds it by the prompt) the answer carries no params and the decode leg is the client's body as it came,
less any `kv_transfer_params` of the client's (the proxy strips them: only the router's legs set them).

A prefill answer is read whole up to MAX_PREFILL_ANSWER_BYTES and must be a JSON object whose params, if
any, are an object; a larger or malformed one fails that leg like an engine's 5xx (a 502 naming no engine,
retried on another prefill engine within the budget) and is logged with the engine's URL.

The proxy sends and relays the decode leg as it relays any answer; a decode leg that fails before its
first byte comes back here for a fresh prefill leg (the old transfer may be gone). A prefill leg that gets
no answer, or a 5xx, is retried on another prefill engine within the same retry budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from corral.engine.pd_protocol import (
    PARAMS,
    STORAGE,
    TRANSFER_PARAMS,
    decode_leg_body,
    handoff_of,
    prefill_leg_body,
    transfer_params_of,
)
from corral.router.datapath.dispatch import Dispatch
from corral.router.datapath.exchange import Answer, error_answer
from corral.router.datapath.retry_budget import RetryBudget
from corral.router.datapath.transfer_params import MAX_PREFILL_ANSWER_BYTES, AnswerTooLarge
from corral.router.datapath.upstream import UPSTREAM_FAILURES, UpstreamClient, describe_failure
from corral.router.membership.endpoint import Endpoint
from corral.router.membership.membership import Membership
from corral.router.membership.pairs import unpaired_reason
from corral.router.routing.request import Policy, RouteRequest
from corral.router.telemetry.metrics import RouterMetrics

log = logging.getLogger("corral.router.pd")

# The requests vLLM's P/D flow covers: generation with a prompt to prefill. Anything else (embeddings,
# tokenize, ...) of a P/D model goes the aggregated way.
PD_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
NAMED = 3  # endpoints named in a 503's reason, at most
NOTED = 1024  # endpoints remembered as logged for a storage hand-off of an unknown connector

Eject = Callable[[Endpoint, str, str, int], None]


@dataclass(slots=True)
class PrefillLeg:
    """A prefill leg that answered: the engine now holds the prompt's KV blocks for a decode engine."""

    prefill: Endpoint
    body: bytes  # the decode leg's body
    decoders: list[Endpoint]  # the decode endpoints compatible with `prefill`, never empty
    answered: float  # time.monotonic() of the prefill answer
    pending: bool = True  # still counted in `prefill.transfers_pending` (never for a storage hand-off)


@dataclass(frozen=True, slots=True)
class NoPair:
    """No routable pair for the request (the proxy answers 503 with Retry-After): `why` in full for the
    router's log (engines' URLs, errors), `public` for the client (words only, no address)."""

    why: str
    public: str


class Disaggregation:
    """The prefill leg and the pair choice; the proxy's decode leg reports back through `paired`,
    `decode_answered`, `decode_failed` and `release`."""

    def __init__(
        self,
        membership: Membership,
        prefill_policy: Policy,
        decode_policy: Policy,
        upstream: UpstreamClient,
        metrics: RouterMetrics,
        budget: RetryBudget,
        max_retries: int,
        eject: Eject,
    ) -> None:
        self._membership = membership
        self._prefill_policy = prefill_policy
        self.decode_policy = decode_policy
        self._upstream = upstream
        self._metrics = metrics
        self._budget = budget
        self._max_retries = max_retries
        self._eject = eject
        # prefill endpoints of unknown connector already logged as handing off through storage
        self._noted: set[str] = set()

    def applies(self, route: RouteRequest, path: str) -> bool:
        """Whether this request goes prefill then decode: a generation request for a model that has
        routable endpoints of a prefill or decode role (all `both`: the aggregated path)."""
        if not self._membership.roles_seen or path not in PD_PATHS or route.payload is None:
            return False  # an aggregated fleet pays one attribute read
        return any(e.role != "both" for e in self._membership.eligible(route.model))

    # -- the prefill leg --------------------------------------------------------------------

    async def prefill(
        self,
        method: str,
        raw_path: str,
        headers: Iterable[tuple[str, str]],
        route: RouteRequest,
        request_id: str,
    ) -> PrefillLeg | NoPair | Answer:
        """Run a prefill leg on a prefill engine that has a compatible decode endpoint, retrying on
        another one within the budget. An Answer is the answer that ends the request (the engine's
        own 4xx, its 5xx once retries are spent, a 502 for an engine that sent no transfer)."""
        assert route.payload is not None
        model = route.model
        payload = dict(route.payload)
        body = orjson.dumps(prefill_leg_body(payload))
        headers = list(headers)
        tried: set[str] = set()
        failures: list[str] = []
        engine_error: Answer | None = None  # the last 5xx a prefill engine answered
        attempt = 0
        while True:
            candidates = self._pairable(model, tried)
            if isinstance(candidates, NoPair):
                if engine_error is not None:  # no other engine to try: the engine's own answer
                    return engine_error
                self._metrics.pd.count_failure("prefill", "no_pair")
                said = f"{_tried(attempt)}; {candidates.public}" if failures else candidates.public
                return NoPair("; ".join([*failures, candidates.why]), said)
            route.prefill_tokens = 0
            endpoint = self._prefill_policy.pick(candidates, route)
            prefill, route.prefill_tokens = route.prefill_tokens, 0  # the decode leg's pick sets its own
            outcome = await self._run(
                endpoint, method, raw_path, headers, body, payload, request_id, attempt, prefill
            )
            if isinstance(outcome, PrefillLeg):
                return self._with_decoders(outcome, model)
            if isinstance(outcome, Answer) and outcome.status < 500:
                return outcome
            if isinstance(outcome, NoPair):
                failures.append(outcome.why)
            else:
                failures.append(f"prefill {endpoint.url} answered {outcome.status}")
                engine_error = outcome
            tried.add(endpoint.url)
            spent = attempt >= self._max_retries
            if not spent and not self._budget.try_spend(time.monotonic()):
                self._metrics.retry_budget_exhausted += 1
                failures.append("retry budget spent, not retried")
                log.warning("request %s: %s", request_id, "; ".join(failures))
                spent = True
            if spent:  # no answer at all: 503 naming every failure; an engine's 5xx: that answer
                if isinstance(outcome, NoPair):
                    return NoPair("; ".join(failures), _tried(attempt))
                return outcome
            attempt += 1
            self._metrics.retries += 1

    def _pairable(self, model: str, tried: set[str]) -> list[Endpoint] | NoPair:
        """The routable prefill endpoints of `model` not tried yet that have a compatible decode endpoint."""
        membership = self._membership
        prefills = [p for p in membership.eligible_role(model, "prefill") if p.url not in tried]
        if not prefills:
            more = " more" if tried else ""
            said = f"no{more} prefill endpoint of it is routable"
            return NoPair(said, said)
        pairable = [p for p in prefills if membership.compatible_decode(model, p)]
        if pairable:
            return pairable
        reasons = dict.fromkeys(unpaired_reason(membership, model, p) for p in prefills[:NAMED])
        return NoPair(
            "; ".join(reasons),
            "no routable decode endpoint can take a prefill engine's KV (their vLLM version, model, KV "
            "layout or KV connector differ, or none serves it)",
        )

    async def _run(
        self,
        endpoint: Endpoint,
        method: str,
        raw_path: str,
        headers: list[tuple[str, str]],
        body: bytes,
        payload: dict[str, Any],
        request_id: str,
        attempt: int,
        prefill: int = 0,
    ) -> PrefillLeg | NoPair | Answer:
        """One prefill attempt on `endpoint`: its answer read whole, counted in its traffic figures
        (and, until then, in its prefill queue: `prefill` tokens, as the pick priced them)."""
        pd = self._metrics.pd
        dispatched = time.monotonic()
        dispatch = Dispatch(endpoint, prefill)  # in its prefill queue until the answer is read whole
        try:
            try:
                upstream = await self._upstream.request(endpoint.url, method, raw_path, headers, body)
                dispatch.answered(upstream)
                answer = await upstream.read(MAX_PREFILL_ANSWER_BYTES)
            except AnswerTooLarge as exc:
                endpoint.traffic.ended(failed=True)
                return self._bad_answer(endpoint, f"a body over {exc.limit} bytes", request_id, attempt)
            except UPSTREAM_FAILURES as exc:
                endpoint.traffic.ended(failed=True)
                why = f"prefill {endpoint.url}: {describe_failure(exc)}"
                self._eject(endpoint, why, request_id, attempt)
                pd.count_failure("prefill", "upstream")
                return NoPair(why, "a prefill engine did not answer")
            endpoint.record_success()
            status = upstream.status
            endpoint.traffic.ended(failed=status >= 500)
            if status >= 400:
                if status >= 500:
                    pd.count_failure("prefill", "engine_error")
                    log.warning("request %s: prefill %s answered %d", request_id, endpoint.url, status)
                # the engine's own verdict on the client's request, relayed as is
                content_type = upstream.content_type or "application/json"
                return Answer(status, answer, [("Content-Type", content_type)])
            seconds = time.monotonic() - dispatched
            endpoint.traffic.first_token(seconds, dispatched, endpoint.routable_from)
            pd.prefill_leg.observe(seconds)
            params = _params_of(answer)
            if isinstance(params, str):
                return self._bad_answer(endpoint, params, request_id, attempt)
            connector = endpoint.supervisor.connector if endpoint.supervisor is not None else None
            handoff = handoff_of(connector)
            if params is None and handoff == PARAMS:
                pd.count_failure("prefill", "no_transfer_params")
                log.warning(
                    "request %s: prefill %s (%s) answered without kv_transfer_params, so no decode engine "
                    'can find its KV cache; check that it runs with --kv-transfer-config {"kv_connector": '
                    '"%s", "kv_role": "kv_producer"} and that nothing between the router and it drops the '
                    "field",
                    request_id,
                    endpoint.url,
                    connector,
                    connector,
                )
                return error_answer(
                    502,
                    "The prefill engine answered without the KV transfer a decode engine needs; the "
                    f"router's log says which engine and what to check (request {request_id}).",
                    "BadGatewayError",
                )
            if params is None or handoff == STORAGE:
                if handoff is None:
                    self._note_storage(endpoint)
                pd.count_handoff(STORAGE)
                # the decode engine finds the prompt's KV in the store: nothing is held for it
                decode_body = orjson.dumps(payload if params is None else decode_leg_body(payload, params))
                return PrefillLeg(endpoint, decode_body, [], time.monotonic(), pending=False)
            pd.count_handoff(PARAMS)
            endpoint.transfers_pending += 1
            decode_body = orjson.dumps(decode_leg_body(payload, params))
            return PrefillLeg(endpoint, decode_body, [], time.monotonic())
        finally:
            dispatch.release()

    def _bad_answer(self, endpoint: Endpoint, what: str, request_id: str, attempt: int) -> Answer:
        """A prefill answer the router will not use: a 502 for this leg (a 5xx: the next prefill engine
        is tried), logged with the engine; counted against it (its traffic figures, an ejection)."""
        self._metrics.pd.count_failure("prefill", "bad_answer")
        why = f"prefill {endpoint.url} answered {what}"
        log.warning("request %s: %s; not used", request_id, why)
        self._eject(endpoint, why, request_id, attempt)
        return error_answer(
            502,
            f"A prefill engine sent an answer the router cannot use; the router's log names it "
            f"(request {request_id}).",
            "BadGatewayError",
        )

    def _note_storage(self, endpoint: Endpoint) -> None:
        """Log once per endpoint that a prefill engine of unknown connector handed off through storage."""
        if endpoint.url in self._noted:
            return
        if len(self._noted) >= NOTED:
            self._noted.clear()
        self._noted.add(endpoint.url)
        log.info(
            "prefill %s answered without kv_transfer_params and its connector is unknown (no supervisor "
            "said it): decode legs carry the client's body, for a storage connector (e.g. ExampleConnector, "
            "LMCacheConnectorV1) whose decode engine finds the KV by the prompt",
            endpoint.url,
        )

    def _with_decoders(self, leg: PrefillLeg, model: str) -> PrefillLeg | NoPair:
        decoders = self._membership.compatible_decode(model, leg.prefill)
        if not decoders:  # they left while the prefill ran; its transfer times out on the engine
            self.release(leg)
            self._metrics.pd.count_failure("decode", "no_pair")
            return NoPair(
                f"prefill {leg.prefill.url} has no compatible decode endpoint left",
                "no compatible decode endpoint was left after the prefill",
            )
        leg.decoders = decoders
        return leg

    # -- the decode leg, as the proxy reports it --------------------------------------------

    def paired(self, leg: PrefillLeg, decode: Endpoint) -> None:
        self._metrics.pd.count_pair(leg.prefill.url, decode.url)

    def decode_answered(self, leg: PrefillLeg, status: int, dispatched: float) -> None:
        """The decode leg's first byte (or whole answer) arrived: the transfer was pulled."""
        now = time.monotonic()
        pd = self._metrics.pd
        pd.decode_ttft.observe(now - dispatched)
        pd.transfer.observe(now - leg.answered)
        if status >= 500:
            pd.count_failure("decode", "engine_error")
        self.release(leg)

    def decode_failed(self, leg: PrefillLeg) -> None:
        """The decode leg got no first byte: its transfer is pulled by nobody and times out."""
        self._metrics.pd.count_failure("decode", "upstream")
        self.release(leg)

    def release(self, leg: PrefillLeg) -> None:
        """The leg's transfer is no longer pending for this router (pulled, or left to time out)."""
        if leg.pending:
            leg.pending = False
            leg.prefill.transfers_pending -= 1


def _tried(attempt: int) -> str:
    tried = attempt + 1
    return f"{tried} prefill {'engine' if tried == 1 else 'engines'} tried, all failed"


def _params_of(answer: bytes) -> dict[str, Any] | str | None:
    """The params of a 2xx prefill answer, None for none, or what is wrong with the answer in words."""
    try:
        parsed = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return f"{len(answer)} bytes that are not JSON"
    if not isinstance(parsed, dict):
        return f"a JSON {type(parsed).__name__}, not an object"
    params = parsed.get(TRANSFER_PARAMS)
    if params is not None and not isinstance(params, dict):
        return f"kv_transfer_params of type {type(params).__name__}, not an object"
    return transfer_params_of(parsed)
