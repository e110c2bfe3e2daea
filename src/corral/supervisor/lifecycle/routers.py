"""The routers subscribed to this supervisor's state stream and what each has acknowledged: the
evidence a drain waits for before it applies its policy.

A router is subscribed while at least one of its `GET /v1/state/watch?router_id=…` connections is
open. It acknowledges an epoch (`POST /v1/acks`) once that epoch's state has taken the engine out of
its routing table and every request it had already picked for the engine has reached it. A drain
waits for an acknowledgement of its removal epoch (or a later one) from every subscribed router; a
router whose stream closes before it acknowledged is counted as gone, not awaited: a router that
loses its stream stops routing to the engine at once (see `corral.router.discovery.supervisor_stream`).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corral.supervisor.lifecycle.states import StateEvent

Record = Callable[..., Any]  # OperationLog.append(record_type, **fields)
Log = Callable[[str], None]

EVENT_TIMES_KEPT = 256


@dataclass(frozen=True)
class Ack:
    """One router's acknowledgement that an epoch's state has taken the engine out of its routing."""

    router_id: str
    epoch: int
    received: float  # time.time() here
    latency_s: float | None  # from this supervisor's event of that epoch to the acknowledgement
    state: str | None = None
    removal_latency_s: float | None = None  # router-side: event line read -> out of the table
    undispatched: int = 0  # requests picked before the removal that had not reached the engine
    transfers_unconfirmed: int = 0  # decode legs from its KV transfers not yet at their decode engine

    def to_json(self) -> dict[str, Any]:
        return {
            "router_id": self.router_id,
            "epoch": self.epoch,
            "received": self.received,
            "latency_s": self.latency_s,
            "state": self.state,
            "removal_latency_s": self.removal_latency_s,
            "undispatched": self.undispatched,
            "transfers_unconfirmed": self.transfers_unconfirmed,
        }


@dataclass
class AckWait:
    """What one wait for acknowledgements of `epoch` saw (for the drain report)."""

    epoch: int
    acknowledged: dict[str, Ack] = field(default_factory=dict)
    gone: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    complete_after_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "acknowledged": [a.to_json() for a in self.acknowledged.values()],
            "gone": list(self.gone),
            "missing": list(self.missing),
            "complete_after_s": self.complete_after_s,
        }


class RouterSubscriptions:
    def __init__(self, record: Record, log: Log, clock: Callable[[], float] = time.time) -> None:
        self._record = record
        self._log = log
        self._clock = clock
        self._streams: dict[str, int] = {}  # router id -> open watch connections
        self._acks: dict[str, Ack] = {}  # latest acknowledgement per router
        self._event_times: OrderedDict[int, float] = OrderedDict()
        self._wait: AckWait | None = None
        self._changed = asyncio.Event()

    # -- what the state machine and the watch stream tell it ------------------------------------

    def note_event(self, event: StateEvent) -> None:
        """Remember when each epoch happened, to time the acknowledgements against it."""
        self._event_times[event.epoch] = event.time
        while len(self._event_times) > EVENT_TIMES_KEPT:
            self._event_times.popitem(last=False)

    def subscribe(self, router_id: str) -> None:
        count = self._streams.get(router_id, 0) + 1
        self._streams[router_id] = count
        if count == 1:
            self._record("router_subscribed", router_id=router_id)
            self._log(f"router {router_id} subscribed to the state stream")
        self._changed.set()

    def unsubscribe(self, router_id: str) -> None:
        count = self._streams.get(router_id, 0) - 1
        if count > 0:
            self._streams[router_id] = count
            return
        self._streams.pop(router_id, None)
        wait = self._wait
        awaited = wait if wait is not None and not self._acked(router_id, wait.epoch) else None
        self._record(
            "router_unsubscribed", router_id=router_id, awaited_epoch=awaited.epoch if awaited else None
        )
        if awaited is not None:
            wait = awaited
            wait.gone.append(router_id)
            self._log(
                f"router {router_id} closed its state stream before acknowledging epoch {wait.epoch}: "
                "counted as gone (a router without the stream does not route here), no longer awaited"
            )
        else:
            self._log(f"router {router_id} unsubscribed from the state stream")
        self._changed.set()

    def acknowledge(
        self,
        router_id: str,
        epoch: int,
        state: str | None = None,
        removal_latency_s: float | None = None,
        undispatched: int = 0,
        transfers_unconfirmed: int = 0,
    ) -> Ack:
        """Record one acknowledgement (in the operation log before this returns)."""
        now = self._clock()
        event_time = self._event_times.get(epoch)
        ack = Ack(
            router_id=router_id,
            epoch=epoch,
            received=now,
            latency_s=None if event_time is None else max(0.0, now - event_time),
            state=state,
            removal_latency_s=removal_latency_s,
            undispatched=undispatched,
            transfers_unconfirmed=transfers_unconfirmed,
        )
        previous = self._acks.get(router_id)
        if previous is None or previous.epoch <= epoch:
            self._acks[router_id] = ack
        self._record(
            "ack",
            **{k: v for k, v in ack.to_json().items() if k != "received"},
            subscribed=router_id in self._streams,
        )
        wait = self._wait
        if wait is not None and epoch >= wait.epoch and router_id not in wait.acknowledged:
            wait.acknowledged[router_id] = ack
        if undispatched:
            self._log(
                f"router {router_id} acknowledged epoch {epoch} with {undispatched} requests it could "
                "not confirm had reached the engine"
            )
        self._changed.set()
        return ack

    # -- what a drain asks -----------------------------------------------------------------------

    def subscribed(self) -> list[str]:
        return sorted(self._streams)

    def _acked(self, router_id: str, epoch: int) -> bool:
        ack = self._acks.get(router_id)
        return ack is not None and ack.epoch >= epoch

    def missing(self, epoch: int) -> list[str]:
        """Subscribed routers that have not acknowledged `epoch` or a later one."""
        return [r for r in sorted(self._streams) if not self._acked(r, epoch)]

    def acknowledged(self, router_id: str, epoch: int) -> Ack | None:
        """`router_id`'s latest acknowledgement when it covers `epoch` (that epoch or a later one)."""
        ack = self._acks.get(router_id)
        return ack if ack is not None and ack.epoch >= epoch else None

    def begin_wait(self, epoch: int) -> AckWait:
        wait = AckWait(epoch)
        for router_id, ack in self._acks.items():
            if ack.epoch >= epoch:
                wait.acknowledged[router_id] = ack
        self._wait = wait
        return wait

    def end_wait(self) -> AckWait | None:
        wait, self._wait = self._wait, None
        if wait is not None:
            wait.missing = self.missing(wait.epoch)
        return wait

    def arm(self) -> None:
        """Forget earlier changes: `changed` now waits for one that comes after this call."""
        self._changed.clear()

    async def changed(self, within: float) -> None:
        """Return when a subscription or acknowledgement changed since `arm`, or after `within` s."""
        try:
            await asyncio.wait_for(self._changed.wait(), within)
        except TimeoutError:
            pass

    def to_json(self) -> dict[str, Any]:
        return {
            "subscribed": {r: n for r, n in sorted(self._streams.items())},
            "acks": {r: a.to_json() for r, a in sorted(self._acks.items())},
        }
