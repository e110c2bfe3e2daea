"""What a membership source says about the endpoints it knows: one added, updated or removed, each
naming the endpoint by its identity (the thing it runs in), never by what membership does with it.
A source emits these into a `MembershipSink` and reads nothing back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from corral.engine_state import EngineState
from corral.router.membership.group_tag import GroupTag


@dataclass(frozen=True, slots=True)
class EndpointAdded:
    """A new endpoint, not yet routable. Adding an identity already known changes nothing."""

    identity: str  # the thing it runs in: a pod UID, a configured backend; never reused
    url: str
    source: str
    reason: str  # the endpoint's own first reason
    origin: str  # where it came from, for the log ("static list", "pod ns/name")
    name: str | None = None
    supervisor_url: str | None = None
    event_version: str | None = None
    group: GroupTag | None = None  # its serving group, routed to only as a whole
    role: str | None = None  # prefill | decode | both as the source declares it; None: it says nothing
    kv_events: str | None = None  # where its engine publishes KV events, `PUB[,REPLAY]` (issue 17)


@dataclass(frozen=True, slots=True)
class EndpointUpdated:
    """The source's view of a known endpoint changed; unknown identities are ignored."""

    identity: str
    reason: str | None  # None: only `event_version` moves on, the endpoint's reason stays
    state: EngineState | None = None
    models: frozenset[str] | None = None
    model_cards: tuple[dict[str, Any], ...] | None = None
    cause: str = "state"
    event_version: str | None = None
    received: float | None = None  # time.monotonic() the cause arrived: a routing exit is timed from it
    pairing: str | None = None  # the P/D pairing identity learnt from the engine; None: nothing new


@dataclass(frozen=True, slots=True)
class EndpointRemoved:
    """The endpoint is gone; `cause` is the low-cardinality label of its routing exit."""

    identity: str
    reason: str
    cause: str = "removed"
    event_version: str | None = None
    received: float | None = None  # time.monotonic() the cause arrived: a routing exit is timed from it


MembershipEvent = EndpointAdded | EndpointUpdated | EndpointRemoved


class MembershipSink(Protocol):
    """Where a source's events go (`corral.router.membership.consumer.MembershipConsumer`)."""

    def emit(self, event: MembershipEvent) -> None: ...
