"""The flow queue of one model: requests held while its engines are saturated, in priority bands
(the highest first), shared within a band among its flows (tenants) by weight, and in each flow first
come first served or earliest deadline first.

Sharing is start-time fair queueing: each flow has a virtual start; the flow with the smallest goes
next and advances by 1/weight; a flow that was idle joins at the band's current virtual time, so it
neither banks credit while idle nor waits behind a flood. Removal (a client gone, an expiry) is lazy:
the item is marked and skipped, its counts taken off at once.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

Order = Literal["fcfs", "edf"]

_seq = itertools.count()


@dataclass(eq=False, slots=True)
class Queued:
    """One held request: where it waits and since when. `left` once it is out of the queue."""

    priority: int
    flow: str
    weight: int
    enqueued: float
    expires: float
    deadline: float  # for `edf`; +inf when the request and its tenant give none
    tenant: str = ""  # the metrics label
    waiter: Any = None  # the gate's: what wakes the request
    seq: int = field(default_factory=lambda: next(_seq))
    left: bool = False


class _Flow:
    __slots__ = ("active", "fcfs", "heap", "live", "name", "start", "weight")

    def __init__(self, name: str, weight: int) -> None:
        self.name = name
        self.weight = weight
        self.start = 0.0  # virtual start of its next request
        self.active = False  # in its band's heap
        self.live = 0
        self.fcfs: deque[Queued] = deque()
        self.heap: list[tuple[float, int, Queued]] = []

    def push(self, item: Queued, order: Order) -> None:
        if order == "edf":
            heapq.heappush(self.heap, (item.deadline, item.seq, item))
        else:
            self.fcfs.append(item)
        self.live += 1

    def peek(self) -> Queued | None:
        """Its next request (those that left are dropped on the way)."""
        fcfs, heap = self.fcfs, self.heap
        while fcfs and fcfs[0].left:
            fcfs.popleft()
        if fcfs:
            return fcfs[0]
        while heap and heap[0][2].left:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def pop(self) -> Queued | None:
        item = self.peek()
        if item is not None:
            if self.fcfs:
                self.fcfs.popleft()
            else:
                heapq.heappop(self.heap)
        return item


class _Band:
    __slots__ = ("arrivals", "flows", "live", "ready", "vtime")

    def __init__(self) -> None:
        self.flows: dict[str, _Flow] = {}
        self.ready: list[tuple[float, int, _Flow]] = []  # active flows by virtual start
        self.vtime = 0.0
        self.live = 0
        self.arrivals: deque[Queued] = deque()  # in arrival order: one TTL per band, so expiry order


class FlowQueue:
    """Bands by priority, fair flows within each, `order` within a flow."""

    def __init__(self, order: Order = "fcfs") -> None:
        self.order: Order = order
        self._bands: dict[int, _Band] = {}
        self._priorities: list[int] = []  # bands present, highest first
        self.depth = 0

    def __len__(self) -> int:
        return self.depth

    def push(self, item: Queued) -> None:
        band = self._bands.get(item.priority)
        if band is None:
            band = self._bands[item.priority] = _Band()
            self._priorities.append(item.priority)
            self._priorities.sort(reverse=True)
        flow = band.flows.get(item.flow)
        if flow is None:
            flow = band.flows[item.flow] = _Flow(item.flow, item.weight)
        flow.weight = item.weight  # the tenants file may have changed it
        flow.push(item, self.order)
        if not flow.active:
            flow.start = max(flow.start, band.vtime)
            flow.active = True
            heapq.heappush(band.ready, (flow.start, item.seq, flow))
        band.arrivals.append(item)
        band.live += 1
        self.depth += 1

    def pop(self, allowed: Callable[[Queued], bool] | None = None) -> Queued | None:
        """The next request to dispatch, out of the queue; None when it is empty or no flow with a
        request waiting is `allowed` (judged by its next request; the others keep their turn)."""
        for priority in self._priorities:
            band = self._bands[priority]
            if band.live == 0:
                continue
            skipped: list[tuple[float, int, _Flow]] = []
            try:
                while band.ready:
                    entry = heapq.heappop(band.ready)
                    start, _, flow = entry
                    item = flow.peek()
                    if item is None:  # its requests all left while it waited its turn
                        flow.active = False
                        continue
                    if allowed is not None and not allowed(item):
                        skipped.append(entry)
                        continue
                    flow.pop()
                    band.vtime = start
                    flow.start = start + 1.0 / flow.weight
                    if flow.live > 1:
                        heapq.heappush(band.ready, (flow.start, item.seq, flow))
                    else:
                        flow.active = False
                    self._took(band, flow, item)
                    return item
            finally:
                for entry in skipped:
                    heapq.heappush(band.ready, entry)
        return None

    def remove(self, item: Queued) -> bool:
        """Take `item` out (its client left, it expired, it is shed); False if it was not queued."""
        if item.left:
            return False
        band = self._bands[item.priority]
        self._took(band, band.flows[item.flow], item)
        return True

    def _took(self, band: _Band, flow: _Flow, item: Queued) -> None:
        item.left = True
        flow.live -= 1
        band.live -= 1
        self.depth -= 1
        if flow.live == 0 and not flow.active:
            # keep the flow's virtual start only while it matters: an idle flow rejoins at vtime
            del band.flows[flow.name]
        if band.live == 0:
            band.arrivals.clear()
            band.ready.clear()
            band.flows.clear()
            del self._bands[item.priority]
            self._priorities.remove(item.priority)

    def expired(self, now: float) -> Iterator[Queued]:
        """Requests whose time in the queue is up (each band's, oldest first); the caller removes them."""
        for priority in list(self._priorities):
            band = self._bands.get(priority)
            if band is None:
                continue
            arrivals = band.arrivals
            while arrivals and (arrivals[0].left or arrivals[0].expires <= now):
                item = arrivals.popleft()
                if not item.left:
                    yield item

    def lowest(self) -> Queued | None:
        """The request to shed first for a more important one: the newest of the lowest band."""
        for priority in reversed(self._priorities):
            band = self._bands[priority]
            for item in reversed(band.arrivals):
                if not item.left:
                    return item
        return None

    def oldest(self) -> Queued | None:
        found: Queued | None = None
        for band in self._bands.values():
            for item in band.arrivals:
                if not item.left:
                    if found is None or item.enqueued < found.enqueued:
                        found = item
                    break
        return found

    def depths(self) -> dict[tuple[int, str], int]:
        """Requests queued by (band, flow)."""
        return {
            (priority, flow.name): flow.live
            for priority, band in self._bands.items()
            for flow in band.flows.values()
            if flow.live
        }
