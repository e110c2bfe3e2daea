"""The set of endpoints the router may send to, and the per-model index it routes from.

Sources (static list, backends file, Kubernetes) change it only through the `MembershipConsumer`,
which turns their events into `add`, `update` and `remove`; supervisor state streams through
`supervisor_changed`; the data path only reads it through `eligible` (and, for prefill/decode
disaggregation, `eligible_role` and `compatible_decode`): sets built once per change and shared by
every request until the next (`corral.router.membership.eligible`), so a pick does not walk the fleet.
An endpoint added with a supervisor is handed to the `SupervisorWatch` (the streams), and taken back
when it is removed. Every time an endpoint leaves routing (removed, or READY -> anything else)
membership keeps a `RoutingExit` record: what left, why, and how many requests had been sent to it by then.

Endpoints of a serving group (`ServingGroups`) are in the per-model index only while their group is
whole. A change that takes one member out takes the others out in the same synchronous call — one
new index, no await in between — so no request is picked for any of them after it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from corral.engine_state import EngineState
from corral.router.membership.eligible import EligibleSet, EligibleSets
from corral.router.membership.endpoint import Endpoint
from corral.router.membership.groups import ServingGroups
from corral.router.membership.operation_steps import OperationSteps

log = logging.getLogger("corral.router.membership")

EXITS_KEPT = 1024


class SupervisorWatch(Protocol):
    """Follows the state streams of supervised endpoints (`corral.router.discovery.supervisor_stream`)."""

    def watch(self, endpoint: Endpoint) -> None: ...

    def unwatch(self, url: str) -> None: ...


@dataclass(frozen=True, slots=True)
class RoutingExit:
    """One endpoint leaving the routing table: removed, or no longer READY."""

    url: str
    source: str
    name: str | None
    kind: str  # "removed" | "unroutable"
    cause: str  # low-cardinality label for metrics: deleted, not_ready, no_ip, ...
    reason: str
    event_version: str | None
    at: float  # time.time()
    at_monotonic: float  # time.monotonic(), comparable across processes on one Linux host
    requests_sent: int

    def as_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "source": self.source,
            "name": self.name,
            "kind": self.kind,
            "cause": self.cause,
            "reason": self.reason,
            "event_resource_version": self.event_version,
            "at": self.at,
            "at_monotonic": self.at_monotonic,
            "requests_sent": self.requests_sent,
        }


class Membership:
    def __init__(self, on_exit: Callable[[RoutingExit], None] | None = None) -> None:
        self._endpoints: dict[str, Endpoint] = {}
        # model -> endpoints that serve it, in any state, less the members of serving groups that
        # are out; rebuilt on every change so that the hot path is one dict lookup and a short filter.
        self._serving: dict[str, tuple[Endpoint, ...]] = {}
        self._known: tuple[str, ...] = ()  # every model any endpoint serves, groups or not
        self._known_set: frozenset[str] = frozenset()
        self._eligible = EligibleSets()
        self.groups = ServingGroups()
        self.exits: deque[RoutingExit] = deque(maxlen=EXITS_KEPT)
        self.operation_steps = OperationSteps()  # runbook steps begun and ended, from supervisor streams
        self._on_exit = on_exit
        self.supervisors: SupervisorWatch | None = None
        # Whether any endpoint has ever had a prefill or decode role (declared or from its
        # supervisor): until then every request takes the aggregated path without looking at roles.
        self.roles_seen = False
        # Told of each change of an endpoint's `in_flight` or prefill queue (url, in flight, prefill
        # tokens, prefilling): the sibling workers of `--workers N` count them (`routing.worker_journal`);
        # None with one worker.
        self.on_in_flight: Callable[[str, int, int, int], None] | None = None
        # Told once when an endpoint comes to be judged failed (`Endpoint.failure_verdict`): the
        # proxy abandons its requests out there (corral.router.datapath.proxy).
        self.failure_listeners: list[Callable[[Endpoint, str], None]] = []
        # Asked of each endpoint as it is added: why to hold it out of routing while it joins (None:
        # route it as soon as it is READY); the router's adapter carry (discovery/adapter_carry.py).
        self.admit: Callable[[Endpoint], str | None] | None = None

    # -- changes (from sources) -------------------------------------------------------------

    def add(self, endpoint: Endpoint, reason: str) -> Endpoint:
        existing = self._endpoints.get(endpoint.url)
        if existing is not None:
            return existing
        self._endpoints[endpoint.url] = endpoint
        endpoint.on_eject = self._eligible.clear
        endpoint.on_in_flight = self.on_in_flight
        self.note_role(endpoint.declared_role)
        if self.admit is not None:
            endpoint.held = self.admit(endpoint)
        log.info("endpoint %s added (%s): %s", endpoint.url, endpoint.state, reason)
        if endpoint.group is not None:
            self.groups.join(endpoint)
            self._judge(endpoint, "group_member_added")
        self._reindex()
        if endpoint.supervisor is not None and self.supervisors is not None:
            self.supervisors.watch(endpoint)
        return endpoint

    def update(
        self,
        url: str,
        reason: str,
        *,
        state: EngineState | None = None,
        models: frozenset[str] | None = None,
        model_cards: tuple[dict[str, Any], ...] | None = None,
        cause: str = "state",
        event_version: str | None = None,
        pairing: str | None = None,
    ) -> Endpoint | None:
        """Change the source's view of an endpoint (its state, what it serves, the pairing identity
        learnt from the engine); unknown urls are ignored. The endpoint's routing state also heeds its
        supervisor (`Endpoint.effective`)."""
        endpoint = self._endpoints.get(url)
        if endpoint is None:
            return None
        if pairing is not None and pairing != endpoint.probed_pairing:
            log.info("endpoint %s: pairing identity %s (from the engine)", url, pairing)
            endpoint.probed_pairing = pairing
            self._eligible.clear()
        if event_version is not None:
            endpoint.last_event_version = event_version
        if state is not None:
            endpoint.source_state = state
        endpoint.source_reason = reason
        self._settle(endpoint, cause)
        if model_cards is not None:
            endpoint.model_cards = model_cards
        if models is not None and models != endpoint.models:
            log.info("endpoint %s serves %s", url, sorted(models))
            endpoint.models = models
            self._reindex()
        return endpoint

    def note_role(self, role: str | None) -> None:
        """A source or a supervisor named a role: a prefill or decode one turns role-aware routing on."""
        if role is not None and role != "both":
            self.roles_seen = True

    def hold(self, url: str, reason: str) -> Endpoint | None:
        """Keep the endpoint out of routing for `reason` (a new reason replaces the old one)."""
        endpoint = self._endpoints.get(url)
        if endpoint is None or endpoint.held == reason:
            return endpoint
        was_in = endpoint.in_routing
        endpoint.held = reason
        log.info("endpoint %s held out of routing: %s", url, reason)
        if was_in:
            self._exit(endpoint, "unroutable", "held", reason)
        self._reindex()
        return endpoint

    def release(self, url: str, why: str) -> Endpoint | None:
        """End the endpoint's hold: routable again as soon as it is READY (its slow start begins)."""
        endpoint = self._endpoints.get(url)
        if endpoint is None or endpoint.held is None:
            return endpoint
        endpoint.held = None
        endpoint.routable_from = time.monotonic()
        log.info("endpoint %s released into routing: %s", url, why)
        self._reindex()
        return endpoint

    def withdraw_models(self, url: str, models: frozenset[str]) -> Endpoint | None:
        """The endpoint's supervisor says which of its models must not be routed to it (now)."""
        endpoint = self._endpoints.get(url)
        if endpoint is not None and endpoint.withdrawn_models != models:
            log.info("endpoint %s: models withdrawn by its supervisor: %s", url, sorted(models))
            endpoint.withdrawn_models = models
            self._reindex()
        return endpoint

    def supervisor_changed(self, url: str, cause: str) -> Endpoint | None:
        """The endpoint's `SupervisorView` changed: recompute its routing state."""
        endpoint = self._endpoints.get(url)
        if endpoint is not None:
            self._eligible.clear()  # a state line may also change its role or pairing
            self._settle(endpoint, cause)
        return endpoint

    def _settle(self, endpoint: Endpoint, cause: str) -> None:
        before, was_in = endpoint.state, endpoint.in_routing
        if endpoint.settle() and before is not endpoint.state:
            self._eligible.clear()
            log.info("endpoint %s %s -> %s: %s", endpoint.url, before, endpoint.state, endpoint.reason)
            if was_in:
                self._exit(endpoint, "unroutable", cause, endpoint.reason)
        # judged on every change, not only of state: a new bundle fingerprint can split a group
        if endpoint.group is not None and self._judge(endpoint, cause):
            self._reindex()
        self._judge_failure(endpoint)

    def _judge_failure(self, endpoint: Endpoint) -> None:
        """Tell the failure listeners once, when the endpoint comes to be judged failed."""
        verdict = endpoint.failure_verdict()
        began = verdict is not None and endpoint.judged_failed is None
        endpoint.judged_failed = verdict
        if began and verdict is not None:
            for listener in list(self.failure_listeners):
                listener(endpoint, verdict)

    def _judge(self, trigger: Endpoint, cause: str) -> bool:
        """Judge `trigger`'s group again; members other than `trigger` that leave routing with it
        get their own exit record. Whether any member's verdict changed (the index must follow)."""
        assert trigger.group is not None
        changed = self.groups.judge(trigger.group.name)
        for member, was_in in changed:
            if member.group_out is not None:
                log.info("endpoint %s out of routing with its group: %s", member.url, member.group_out)
                if was_in and member is not trigger:
                    self._exit(member, "unroutable", "group_out", member.group_out)
            else:
                log.info("endpoint %s back in routing: group %s whole", member.url, trigger.group.name)
                member.routable_from = time.monotonic()  # the group's slow start begins now
        return bool(changed)

    def remove(
        self, url: str, reason: str, cause: str = "removed", event_version: str | None = None
    ) -> Endpoint | None:
        """Forget an endpoint; requests already in flight to it finish on their own."""
        endpoint = self._endpoints.pop(url, None)
        if endpoint is not None:
            endpoint.on_eject = None
        if endpoint is not None and self.supervisors is not None and endpoint.supervisor is not None:
            self.supervisors.unwatch(url)
        if endpoint is not None:
            if event_version is not None:
                endpoint.last_event_version = event_version
            log.info("endpoint %s removed: %s", url, reason)
            self._exit(endpoint, "removed", cause, reason)
            if endpoint.group is not None:
                self.groups.leave(endpoint, reason)
                self._judge(endpoint, cause)
            self._reindex()
        return endpoint

    def _exit(self, endpoint: Endpoint, kind: str, cause: str, reason: str) -> None:
        record = RoutingExit(
            url=endpoint.url,
            source=endpoint.source,
            name=endpoint.name,
            kind=kind,
            cause=cause,
            reason=reason,
            event_version=endpoint.last_event_version,
            at=time.time(),
            at_monotonic=time.monotonic(),
            requests_sent=endpoint.requests_sent,
        )
        self.exits.append(record)
        if self._on_exit is not None:
            self._on_exit(record)

    def _reindex(self) -> None:
        self._eligible.clear()
        serving: dict[str, list[Endpoint]] = {}
        known: dict[str, None] = {}  # in first-seen order, as the index was
        for endpoint in self._endpoints.values():
            models = endpoint.models - endpoint.withdrawn_models
            known.update(dict.fromkeys(models))
            if endpoint.group_out is None and endpoint.held is None:
                for model in models:
                    serving.setdefault(model, []).append(endpoint)
        self._serving = {model: tuple(eps) for model, eps in serving.items()}
        self._known = tuple(known)
        self._known_set = frozenset(known)

    # -- reads ------------------------------------------------------------------------------

    def get(self, url: str) -> Endpoint | None:
        return self._endpoints.get(url)

    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints.values())

    def eligible(self, model: str, now: float | None = None) -> EligibleSet:
        """Endpoints that may take a request for `model` now: READY, serving it, not ejected. The same
        (read-only) set until membership changes or an ejection ends."""
        return self._eligible.get(
            model, None, self._serving.get(model, ()), time.monotonic() if now is None else now
        )

    def eligible_role(self, model: str, role: str, now: float | None = None) -> EligibleSet:
        """The eligible endpoints for `model` that can take `role`'s leg: role `role`, or `both`."""
        return self._eligible.get(
            model, role, self._serving.get(model, ()), time.monotonic() if now is None else now
        )

    @property
    def eligible_builds(self) -> int:
        """How many eligible sets have been built (once per change and model, not per request)."""
        return self._eligible.builds

    def compatible_decode(self, model: str, prefill: Endpoint, now: float | None = None) -> list[Endpoint]:
        """The eligible decode endpoints for `model` that may take `prefill`'s transfer: the same pairing
        identity, and not `prefill` itself. An unknown identity on either side pairs with nothing: the
        router never vouches for a pair it cannot compare."""
        pairing = prefill.pairing
        if pairing is None:
            return []
        return [
            e for e in self.eligible_role(model, "decode", now) if e.pairing == pairing and e is not prefill
        ]

    def knows(self, model: str) -> bool:
        """Whether any endpoint, in any state, has said it serves `model`."""
        return model in self._known_set

    def known_models(self) -> list[str]:
        return list(self._known)

    def group_members(self, endpoint: Endpoint) -> list[Endpoint]:
        """`endpoint` and the other members of its serving group (just `endpoint` when it has none)."""
        return self.groups.members(endpoint)

    def ready_count(self) -> int:
        """Endpoints that are READY and, in a serving group, whose group is whole."""
        return sum(1 for e in self._endpoints.values() if e.in_routing)

    def retry_after(self, model: str, default: float) -> int:
        """Seconds a client should wait before retrying `model`: the soonest ejection end."""
        now = time.monotonic()
        waits = [e.ejected_until - now for e in self._serving.get(model, ()) if e.is_ejected(now)]
        seconds = min(waits) if waits else default
        return max(1, int(seconds + 0.999))

    def model_cards(self) -> list[dict[str, Any]]:
        """The union of what READY endpoints serve, one card per model id (first seen wins)."""
        seen: dict[str, dict[str, Any]] = {}
        for endpoint in self._endpoints.values():
            if not endpoint.in_routing:
                continue
            for card in endpoint.model_cards:
                model_id = card.get("id")
                if isinstance(model_id, str) and model_id not in seen:
                    seen[model_id] = card
        return list(seen.values())
