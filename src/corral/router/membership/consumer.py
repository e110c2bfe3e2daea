"""The one writer of membership for the sources: it turns their `EndpointAdded/Updated/Removed`
events into `Endpoint`s in `Membership`, keyed by identity. An identity is never an address: a new
identity at a known address first removes the endpoint there (cause `replaced`), so nothing of the
old one — ejection, affinity, acknowledgements — carries over."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.membership.events import (
    EndpointAdded,
    EndpointRemoved,
    EndpointUpdated,
    MembershipEvent,
)
from corral.router.membership.membership import Membership

log = logging.getLogger("corral.router.membership")


class MembershipConsumer:
    def __init__(self, membership: Membership, exit_latency: Callable[[float], None] | None = None) -> None:
        self.membership = membership
        self._exit_latency = exit_latency  # RouterMetrics.removal_latency.observe
        self._urls: dict[str, str] = {}  # identity -> url of its endpoint in membership
        self._identities: dict[str, str] = {}  # url -> identity of the endpoint there

    def emit(self, event: MembershipEvent) -> None:
        if isinstance(event, EndpointAdded):
            self._add(event)
        elif isinstance(event, EndpointUpdated):
            url, reason = self._urls.get(event.identity), event.reason
            if url is not None and reason is None:
                endpoint = self.membership.get(url)
                if endpoint is not None and event.event_version is not None:
                    endpoint.last_event_version = event.event_version
            elif url is not None and reason is not None:
                was_ready = self._routable(url)
                self.membership.update(
                    url,
                    reason,
                    state=event.state,
                    models=event.models,
                    model_cards=event.model_cards,
                    cause=event.cause,
                    event_version=event.event_version,
                    pairing=event.pairing,
                )
                if was_ready and not self._routable(url):
                    self._timed_exit(event.received)
        else:
            self._remove(event)

    def url_of(self, identity: str) -> str | None:
        return self._urls.get(identity)

    def _add(self, event: EndpointAdded) -> None:
        if event.identity in self._urls:
            return  # the same endpoint again: a replay, nothing changes
        holder = self._identities.get(event.url)
        if holder is not None:
            reason = f"{event.url} now belongs to {event.origin}"
            self._remove(EndpointRemoved(holder, reason, cause="replaced", event_version=event.event_version))
        endpoint = Endpoint(
            event.url,
            reason=event.reason,
            source=event.source,
            name=event.name,
            supervisor=SupervisorView(event.supervisor_url) if event.supervisor_url else None,
            group=event.group,
            role=event.role,
            kv_events=event.kv_events,
        )
        if event.event_version is not None:
            endpoint.last_event_version = event.event_version
        self.membership.add(endpoint, event.origin)
        self._urls[event.identity] = event.url
        self._identities[event.url] = event.identity

    def _remove(self, event: EndpointRemoved) -> None:
        url = self._urls.pop(event.identity, None)
        if url is None:
            return
        self._identities.pop(url, None)
        was_ready = self._routable(url)
        self.membership.remove(url, event.reason, cause=event.cause, event_version=event.event_version)
        if was_ready:
            self._timed_exit(event.received)

    def _routable(self, url: str) -> bool:
        endpoint = self.membership.get(url)
        return endpoint is not None and endpoint.in_routing

    def _timed_exit(self, received: float | None) -> None:
        """A routable endpoint left routing: how long after its cause arrived (when the source says)."""
        if received is not None and self._exit_latency is not None:
            self._exit_latency(time.monotonic() - received)
