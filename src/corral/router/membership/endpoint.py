"""One backend engine as the router sees it: where it is, where it was learnt from, what it serves,
its lifecycle state, the requests the router has in flight to it, and whether it is ejected after a
failure.

Its `state` is what routing reads. Without a supervisor it is what the membership source says; with
one (`SupervisorView`), the supervisor's state stream has the last word: the endpoint is READY only
while the source says so and the supervisor, on a live stream, says READY too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.contracts.supervisor import OperationInFlight
from corral.engine_state import EngineState
from corral.router.membership.group_tag import GroupTag
from corral.router.telemetry.traffic import EndpointTraffic

# Repeated ejections double the ejection time, up to this many times the base.
MAX_EJECTION_FACTOR = 32
# The supervisor's DRAINING sub-state for an engine withdrawn because it stopped answering (the
# supervisor's DrainPhase.NOT_ANSWERING; the router does not import the supervisor).
NOT_ANSWERING = "not_answering"


@dataclass(slots=True)
class SupervisorView:
    """What the router knows from an endpoint's supervisor state stream."""

    url: str
    link: str = "connecting"  # connecting | connected | stale | lost
    link_reason: str = "not yet connected"
    state: EngineState | None = None
    sub_state: str | None = None
    reason: str = ""
    epoch: int | None = None
    event_time: float | None = None  # the supervisor's wall clock for the last state event
    last_heard: float | None = None  # time.monotonic() of the last line read
    acked_epoch: int | None = None
    acks_sent: int = 0
    fingerprint: str | None = None  # the running bundle's, as the last state line said
    bundle_name: str | None = None  # and its name (supervisors since issue 32)
    prefix_epoch: str | None = None  # changes when the engine's prefix cache was emptied
    # prefill | decode | both, and the P/D pairing identity, as the last state line said (absent
    # from supervisors before issue 16: None, and the endpoint's declared role and probed identity hold)
    role: str | None = None
    pairing: str | None = None
    connector: str | None = None  # the engine's KV connector, as the last state line said (issue 17)
    kv_events: str | None = None  # where its engine publishes KV events, `PUB[,REPLAY]` (issue 17)
    # the runbook operation in flight and its step, as the stream last said (issue 18); a lost stream
    # keeps the last word, as it keeps the last state
    operation: OperationInFlight | None = None

    def blocker(self) -> tuple[EngineState, str] | None:
        """(state, reason) that keeps the endpoint out of routing, or None when the supervisor, on a
        live stream, says READY. A lost or silent stream keeps the last state it gave, never READY."""
        if self.link != "connected" or self.state is None:
            last = self.state if self.state not in (None, EngineState.READY) else EngineState.STARTING
            said = f"; last said {self.state} at epoch {self.epoch}" if self.state is not None else ""
            return last, f"supervisor {self.url} stream {self.link} ({self.link_reason}){said}"
        if self.state is not EngineState.READY:
            sub = f"/{self.sub_state}" if self.sub_state else ""
            return self.state, f"supervisor: {self.state}{sub} at epoch {self.epoch}: {self.reason}"
        return None

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "url": self.url,
            "stream": self.link,
            "stream_reason": self.link_reason,
            "state": self.state.value if self.state is not None else None,
            "sub_state": self.sub_state,
            "reason": self.reason,
            "epoch": self.epoch,
            "heard_seconds_ago": None if self.last_heard is None else round(now - self.last_heard, 3),
            "acked_epoch": self.acked_epoch,
            "acks_sent": self.acks_sent,
            "fingerprint": self.fingerprint,
            "bundle_name": self.bundle_name,
            "prefix_epoch": self.prefix_epoch,
            "role": self.role,
            "pairing": self.pairing,
            "connector": self.connector,
            "kv_events": self.kv_events,
            "operation": self.operation.to_wire() if self.operation is not None else None,
        }


class Endpoint:
    """A backend engine. `in_flight` is the router's own count of requests it has open there;
    `host_in_flight` adds those of its sibling workers on the host (`--workers N`), what routing reads."""

    __slots__ = (
        "_in_flight",
        "consecutive_failures",
        "declared_role",
        "dispatching",
        "ejected_until",
        "group",
        "group_out",
        "held",
        "host_in_flight",
        "host_prefill_tokens",
        "host_prefilling",
        "judged_failed",
        "kv_events",
        "last_event_version",
        "model_cards",
        "models",
        "name",
        "on_eject",
        "on_in_flight",
        "prefill_tokens",
        "prefilling",
        "probed_pairing",
        "ramp_earned",
        "ramp_start",
        "ramp_taken",
        "reason",
        "requests_sent",
        "routable_from",
        "since",
        "source",
        "source_reason",
        "source_state",
        "state",
        "supervisor",
        "tallies",
        "traffic",
        "transfers_pending",
        "url",
        "withdrawn_models",
    )

    def __init__(
        self,
        url: str,
        models: frozenset[str] = frozenset(),
        state: EngineState = EngineState.STARTING,
        reason: str = "not yet seen",
        *,
        source: str = "static",
        name: str | None = None,
        supervisor: SupervisorView | None = None,
        group: GroupTag | None = None,
        role: str | None = None,
        kv_events: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        # Where its engine publishes KV-cache events as its membership source declared it, `PUB[,REPLAY]`
        # (engine/kv_events_address); its supervisor's word, when it gives one, wins.
        self.kv_events = kv_events
        # prefill | decode | both as its membership source declared it (None: it said nothing); the
        # supervisor's role, when it publishes one, wins (`role`).
        self.declared_role = role
        # The P/D pairing identity learnt from the engine itself (its /version and model root), for an
        # endpoint whose supervisor publishes none (`pairing`).
        self.probed_pairing: str | None = None
        # The serving group it belongs to, and why that group is out of routing (None: whole, or no
        # group). `state` stays the endpoint's own; routing also needs `group_out` None.
        self.group = group
        self.group_out: str | None = None
        # Why the router itself keeps it out of routing while it joins (None: it does not): a new engine
        # held until the fleet's runtime LoRA adapters are loaded there (discovery/adapter_carry.py).
        self.held: str | None = None
        # Where membership learnt of it (static | file | k8s) and its name there (a pod's ns/name).
        self.source = source
        self.name = name
        # The resourceVersion of the last Kubernetes event about it; None for other sources.
        self.last_event_version: str | None = None
        # Requests the router has sent here, counted when the endpoint is picked (before any I/O).
        self.requests_sent = 0
        self.models = models
        # Models its supervisor has withdrawn from routing (a LoRA adapter about to be unloaded):
        # not routed here although the engine still lists them.
        self.withdrawn_models: frozenset[str] = frozenset()
        # The backend's own /v1/models entries, kept whole so the router's union keeps their fields.
        self.model_cards: tuple[dict[str, Any], ...] = ()
        # The membership source's view; `state`/`reason` combine it with the supervisor's (`settle`).
        self.source_state = state
        self.source_reason = reason
        self.supervisor = supervisor
        self.state = state
        self.reason = reason
        self.since = time.time()
        # time.monotonic() it last became routable (READY, its group whole, back from an ejection):
        # where its slow-start ramp begins (corral.router.routing.slow_start, which keeps ramp_*).
        self.routable_from = time.monotonic()
        self.ramp_start = -1.0
        self.ramp_taken = 0
        self.ramp_earned = 0.0
        self.settle()
        self._in_flight = 0
        # `in_flight` plus the sibling workers' requests open here (`routing.worker_journal`): the count
        # the policies and the load bound read, so a host's workers balance one load; `in_flight` with
        # one worker.
        self.host_in_flight = 0
        # Of those, the requests that have not had their first byte yet and the uncached prompt tokens
        # their picks expected this engine to compute (`prefill_sent`): the prefill queue a cost
        # placement waits behind (routing/prefill_cost.py); `host_*` adds the sibling workers'.
        self.prefill_tokens = 0
        self.prefilling = 0
        self.host_prefill_tokens = 0
        self.host_prefilling = 0
        # Told of each change of `in_flight` or of the prefill queue (url, in flight, prefill tokens,
        # prefilling), for the sibling workers; None with one worker.
        self.on_in_flight: Callable[[str, int, int, int], None] | None = None
        # The eligible sets (membership.eligible) it is in, whose in-flight totals follow its own.
        self.tallies: tuple[Any, ...] = ()
        # Told of each ejection (membership rebuilds its eligible sets then); None outside membership.
        self.on_eject: Callable[[], None] | None = None
        # Picked for a request whose upstream call has not answered yet: it may not have reached the
        # engine. An acknowledgement of removal waits for this to reach zero.
        self.dispatching = 0
        self.ejected_until = 0.0  # time.monotonic() deadline; 0 when not ejected
        # Why the router judges the engine failed now (None: it does not), kept by membership so that
        # the requests out there are abandoned once, when the judgment begins (`failure_verdict`).
        self.judged_failed: str | None = None
        self.consecutive_failures = 0
        # What the router saw of its answers (requests, errors, TTFT, ITL, warmup): /v1/fleet `traffic`.
        self.traffic = EndpointTraffic()
        # P/D: prefill legs this router ran here whose decode leg has not reached its first byte yet (the
        # KV blocks are still held for it); a drain of this prefill engine waits for them (P4).
        self.transfers_pending = 0

    def __repr__(self) -> str:
        return f"Endpoint({self.url!r}, {self.state}, in_flight={self.in_flight})"

    @property
    def in_flight(self) -> int:
        """The router's requests open here; setting it keeps `host_in_flight` and its eligible sets'
        totals (O(1) load bound), and tells the sibling workers."""
        return self._in_flight

    @in_flight.setter
    def in_flight(self, count: int) -> None:
        change = count - self._in_flight
        self._in_flight = count
        self.host_in_flight += change
        for tally in self.tallies:
            tally.in_flight += change
        if self.on_in_flight is not None:
            self.on_in_flight(self.url, count, self.prefill_tokens, self.prefilling)

    def sibling_in_flight(self, change: int, prefill_tokens: int = 0, prefilling: int = 0) -> None:
        """A sibling worker's requests open here changed by `change`, its prefill queue by
        `prefill_tokens` over `prefilling` requests."""
        self.host_in_flight += change
        self.host_prefill_tokens += prefill_tokens
        self.host_prefilling += prefilling
        for tally in self.tallies:
            tally.in_flight += change

    def prefill_sent(self, tokens: int) -> None:
        """A request was sent here whose pick expects `tokens` uncached prompt tokens to compute before
        its first token (`prefill_done` when its first byte comes back, or it ends)."""
        self._prefill(tokens, 1)

    def prefill_done(self, tokens: int) -> None:
        """A request sent with `prefill_sent(tokens)` had its first byte, or ended without one."""
        self._prefill(-tokens, -1)

    def _prefill(self, tokens: int, requests: int) -> None:
        self.prefill_tokens += tokens
        self.prefilling += requests
        self.host_prefill_tokens += tokens
        self.host_prefilling += requests
        if self.on_in_flight is not None:
            self.on_in_flight(self.url, self._in_flight, self.prefill_tokens, self.prefilling)

    @property
    def role(self) -> str:
        """prefill | decode | both: its supervisor's word when it gave one, else the declared role."""
        if self.supervisor is not None and self.supervisor.role is not None:
            return self.supervisor.role
        return self.declared_role or "both"

    @property
    def pairing(self) -> str | None:
        """The P/D pairing identity (engine/pd_protocol.pairing_identity): a prefill and a decode
        endpoint pair only when theirs are equal; None when unknown (never paired)."""
        if self.supervisor is not None and self.supervisor.pairing is not None:
            return self.supervisor.pairing
        return self.probed_pairing

    @property
    def adapters(self) -> list[str]:
        """The LoRA adapters it serves: the models its /v1/models lists with a `parent` (the base)."""
        return sorted(str(c["id"]) for c in self.model_cards if c.get("parent") and c.get("id"))

    def role_mismatch(self) -> str | None:
        """Why the declared role is not the one routing uses (its supervisor says otherwise), or None."""
        said = self.supervisor.role if self.supervisor is not None else None
        if self.declared_role is None or said is None or said == self.declared_role:
            return None
        return f"declared role {self.declared_role} but its supervisor says {said} (the supervisor's wins)"

    def set_state(self, state: EngineState, reason: str) -> bool:
        """Move to `state`; returns whether anything changed (a new reason alone counts)."""
        if state is self.state and reason == self.reason:
            return False
        if state is not self.state:
            self.since = time.time()
            if state is EngineState.READY:
                self.routable_from = time.monotonic()
        self.state = state
        self.reason = reason
        return True

    def effective(self) -> tuple[EngineState, str]:
        """The state routing reads: the supervisor's blocker if any, else the source's view."""
        if self.supervisor is not None:
            blocked = self.supervisor.blocker()
            if blocked is not None:
                return blocked
            if self.source_state is EngineState.READY:
                return (
                    EngineState.READY,
                    f"{self.source_reason}; supervisor READY at epoch {self.supervisor.epoch}",
                )
        return self.source_state, self.source_reason

    def settle(self) -> bool:
        """Recompute `state` from the source's and the supervisor's views; whether it changed."""
        return self.set_state(*self.effective())

    def failure_verdict(self) -> str | None:
        """Why the engine is judged failed, or None: its probe failed after it had answered (the
        source's FAILED), or its supervisor, on a live stream, says FAILED or DRAINING/not_answering.
        A drain (DRAINING otherwise, SLEEPING, STOPPING) is not a failure: its requests finish there."""
        if self.source_state is EngineState.FAILED:
            return self.source_reason
        view = self.supervisor
        if view is None or view.link != "connected":
            return None
        if view.state is EngineState.FAILED or (
            view.state is EngineState.DRAINING and view.sub_state == NOT_ANSWERING
        ):
            sub = f"/{view.sub_state}" if view.sub_state else ""
            return f"supervisor: {view.state}{sub} at epoch {view.epoch}: {view.reason}"
        return None

    def is_ejected(self, now: float) -> bool:
        return self.ejected_until > now

    def routable(self, now: float) -> bool:
        return self.in_routing and self.ejected_until <= now

    @property
    def in_routing(self) -> bool:
        """READY on its own and, in a serving group, the group whole: what the routing index holds."""
        return self.state is EngineState.READY and self.group_out is None and self.held is None

    def routing_verdict(self, now: float) -> str:
        """Why the endpoint does or does not take requests now, in words for /v1/fleet."""
        verdict = self._verdict(now)
        mismatch = self.role_mismatch()
        return f"{verdict}; {mismatch}" if mismatch is not None else verdict

    def _verdict(self, now: float) -> str:
        if self.state is not EngineState.READY:
            return f"not routable: {self.state.value} ({self.reason})"
        if self.group_out is not None:
            return f"not routable: {self.group_out}"
        if self.held is not None:
            return f"not routable: {self.held}"
        if self.ejected_until > now:
            return f"not routable: ejected for {self.ejected_until - now:.1f} s more after a failure"
        return "routable: READY and not ejected"

    def eject(self, now: float, base_seconds: float) -> float | None:
        """Eject after a connection failure; each further failure in a row doubles the time.

        Failures while already ejected (requests that were in flight together) count once, so
        one crash does not blow the backoff up. Returns the ejection length, or None if the
        endpoint was already ejected.
        """
        if self.ejected_until > now:
            return None
        factor: int = min(2**self.consecutive_failures, MAX_EJECTION_FACTOR)
        self.consecutive_failures += 1
        seconds = base_seconds * factor
        self.ejected_until = now + seconds
        self.routable_from = max(self.routable_from, self.ejected_until)  # it ramps up when back
        if self.on_eject is not None:
            self.on_eject()
        return seconds

    def record_success(self) -> None:
        if self.consecutive_failures:
            self.consecutive_failures = 0

    def ejected_until_wall(self, now: float) -> float | None:
        """The ejection deadline on the wall clock, for display; None when not ejected."""
        if self.ejected_until <= now:
            return None
        return time.time() + (self.ejected_until - now)
