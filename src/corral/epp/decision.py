"""One pick for the gateway: the request's model and prompt read from its body, its tenant admitted (the
router's caps: a shed request is a 429), the eligible endpoints of the model (membership's, narrowed to
the gateway's subset hint), the router's policy picking the primary and the least loaded of the rest as
ordered fallbacks; for a P/D model, a prefill engine and a decode engine paired as the router pairs
them. A request that cannot be picked for gets the answer the gateway returns to the client."""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson
from aiohttp import web

from corral.openai_errors import error_body
from corral.router.core import RouterCore
from corral.router.datapath.pd import PD_PATHS
from corral.router.edge.tenants import Tenant, TenantGate
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.request import Policy, RouteRequest

RETRY_AFTER_SECONDS = 5.0  # a 503's Retry-After when membership knows no better


@dataclass(slots=True)
class Pick:
    """Where the request goes: `endpoint` first, then `fallbacks` in order; `prefill` for a P/D pair."""

    endpoint: Endpoint
    fallbacks: list[Endpoint]
    route: RouteRequest
    prefill: Endpoint | None = None
    tenant: Tenant | None = None


@dataclass(slots=True)
class Refusal:
    """The answer the gateway gives the client instead of an upstream (an OpenAI error body)."""

    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)


def address(endpoint: Endpoint) -> str:
    """The endpoint's `ip:port`, as the gateway names upstream hosts."""
    return urlsplit(endpoint.url).netloc.rpartition("@")[2]


def refusal(status: int, message: str, kind: str, param: str | None = None, retry_after: int = 0) -> Refusal:
    headers = [("content-type", "application/json")]
    if retry_after:
        headers.append(("retry-after", str(retry_after)))
    return Refusal(status, error_body(message, kind, status, param), headers)


class Picker:
    """Picks with the router's core; `gate` holds the tenants' caps when the picker has an API-keys file."""

    def __init__(self, core: RouterCore, gate: TenantGate | None = None, fallbacks: int = 2) -> None:
        self.core = core
        self.gate = gate
        self.fallbacks = fallbacks
        self._decode_policy: Policy = core.routing.selector.policies["load"]  # as the router's P/D legs
        self._addresses: dict[str, str] = {}

    def address(self, endpoint: Endpoint) -> str:
        found = self._addresses.get(endpoint.url)
        if found is None:
            if len(self._addresses) > 4 * len(self.core.membership.endpoints()) + 64:
                self._addresses.clear()  # endpoints that left; rebuilt as picked
            found = self._addresses[endpoint.url] = address(endpoint)
        return found

    def by_address(self, text: str) -> Endpoint | None:
        """The member at `ip:port` (the endpoint the gateway says served a request)."""
        return next((e for e in self.core.membership.endpoints() if self.address(e) == text), None)

    def decide(
        self, headers: Mapping[str, str], body: bytes, path: str, subset: frozenset[str] | None
    ) -> Pick | Refusal:
        payload, problem = _payload(body)
        if problem is not None:
            return problem
        tenant: Tenant | None = None
        if self.gate is not None:
            key = headers.get("authorization")
            admitted = self.gate.admit({"Authorization": key} if key is not None else {}, "POST")
            if isinstance(admitted, web.Response):
                return _from_response(admitted)
            tenant = admitted
        picked = self._pick(headers, payload, path, subset, tenant)
        if isinstance(picked, Refusal) and tenant is not None:
            TenantGate.release(tenant, picked.status)
        elif isinstance(picked, Pick):
            picked.tenant = tenant
        return picked

    def _pick(
        self,
        headers: Mapping[str, str],
        payload: dict[str, Any] | None,
        path: str,
        subset: frozenset[str] | None,
        tenant: Tenant | None,
    ) -> Pick | Refusal:
        membership = self.core.membership
        model, problem = self._model(payload, tenant)
        if problem is not None:
            return problem
        assert model is not None
        eligible = self._within(membership.eligible(model), subset)
        route = RouteRequest(model, headers, payload)
        if not eligible:
            return self._unavailable(model, subset)
        if membership.roles_seen and path in PD_PATHS and any(e.role != "both" for e in eligible):
            return self._pair(model, route, subset)
        endpoint = self.core.routing.policy.pick(eligible, route)
        return Pick(endpoint, self._fallbacks(eligible, endpoint), route)

    def _pair(self, model: str, route: RouteRequest, subset: frozenset[str] | None) -> Pick | Refusal:
        """A prefill engine by the model's policy (its prefix lives there), then a decode engine that can
        take its transfer, least loaded first; the gateway sends to the decode engine and names the
        prefill engine in `x-prefiller-host-port` (the decode side runs the prefill leg)."""
        membership = self.core.membership
        prefills = self._within(membership.eligible_role(model, "prefill"), subset)
        if not prefills:
            return self._unavailable(model, subset)
        prefill = self.core.routing.policy.pick(prefills, route)
        decoders = self._within(membership.compatible_decode(model, prefill), subset)
        if not decoders:
            return self._unavailable(model, subset)
        decode = self._decode_policy.pick(decoders, route)
        return Pick(decode, self._fallbacks(decoders, decode), route, prefill=prefill)

    def _within(self, eligible: Sequence[Endpoint], subset: frozenset[str] | None) -> Sequence[Endpoint]:
        if subset is None:
            return eligible
        return [e for e in eligible if self.address(e) in subset]

    def _fallbacks(self, candidates: Sequence[Endpoint], chosen: Endpoint) -> list[Endpoint]:
        """The others, least in flight first (membership's order among equals), at most `fallbacks`."""
        if self.fallbacks == 0:
            return []
        rest = (e for e in candidates if e is not chosen)
        return heapq.nsmallest(self.fallbacks, rest, key=lambda e: e.host_in_flight)  # stable, as sorted

    def _model(
        self, payload: dict[str, Any] | None, tenant: Tenant | None
    ) -> tuple[str | None, Refusal | None]:
        membership = self.core.membership
        model = payload.get("model") if payload is not None else None
        if model is None:
            known = [m for m in membership.known_models() if tenant is None or tenant.serves(m)]
            if len(known) == 1:
                return known[0], None  # vLLM serves its only model when none is named
            if not known:
                return None, self._unavailable("", None)
            return None, refusal(
                400,
                f"The request names no `model` and the fleet serves {len(known)}: "
                f"{', '.join(sorted(known))}. Name one.",
                "BadRequestError",
                "model",
            )
        if not isinstance(model, str):
            return None, refusal(400, "`model` must be a string.", "BadRequestError", "model")
        hidden = tenant is not None and not tenant.serves(model)
        if hidden or not membership.knows(model):
            if not membership.known_models():
                return None, self._unavailable(model, None)
            if tenant is not None and hidden:
                tenant.reject("model")
            return None, refusal(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        return model, None

    def _unavailable(self, model: str, subset: frozenset[str] | None) -> Refusal:
        retry_after = self.core.membership.retry_after(model, RETRY_AFTER_SECONDS)
        what = f"model `{model}`" if model else "this request"
        why = "no endpoint of it is READY"
        if subset is not None:
            why += " among the gateway's subset of endpoints"
        return refusal(
            503,
            f"No engine could serve {what} right now: {why}; retry after {retry_after} s.",
            "ServiceUnavailableError",
            retry_after=retry_after,
        )


def _payload(body: bytes) -> tuple[dict[str, Any] | None, Refusal | None]:
    """The request's JSON object; an empty body is none (a GET, a multipart upload routes by model alone)."""
    if not body:
        return None, None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return None, refusal(400, f"The request body is not valid JSON: {exc}", "BadRequestError", "body")
    if not isinstance(parsed, dict):
        return None, refusal(400, "The request body must be a JSON object.", "BadRequestError", "body")
    return parsed, None


def _from_response(response: web.Response) -> Refusal:
    """The gate's 401/429, as the gateway returns it."""
    body = response.body if isinstance(response.body, bytes) else b""
    return Refusal(response.status, body, [(k.lower(), v) for k, v in response.headers.items()])
