"""When an engine is saturated, and how many more requests the eligible engines of a model can take.

Two signals, either enough: this host's requests open on the engine (`host_in_flight`, with
`--workers N` its siblings' too) at `engine_max_in_flight`; or the engine's own figures (the load
board the scraper fills: requests waiting, KV-cache use) at or over their thresholds. Figures say how
the engine stood when scraped: from then on it takes one request for each of the requests it had open
then that has ended, until fresher figures come. An engine without fresh figures is judged by its
in-flight count alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from corral.router.flow.config import FlowConfig
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.load_board import LoadBoard

UNBOUNDED = 1 << 30


class Saturation:
    def __init__(self, config: FlowConfig, board: LoadBoard | None) -> None:
        self._cap = config.engine_max_in_flight
        self._waiting = config.max_waiting
        self._kv = config.max_kv_usage
        self._board = board
        # url -> (the figures' scrape time, the engine's in-flight count when the router first read them)
        self._seen: dict[str, tuple[float, int]] = {}

    def room(self, endpoint: Endpoint, now: float) -> int:
        """Requests `endpoint` can take now (UNBOUNDED when nothing bounds it)."""
        cap = self._cap
        open_now = endpoint.host_in_flight
        room = cap - open_now if cap else UNBOUNDED
        board = self._board
        if board is not None:
            load = board.fresh(endpoint.url, now)
            if load is not None and (load.waiting >= self._waiting or load.kv_usage >= self._kv):
                seen = self._seen.get(endpoint.url)
                if seen is None or seen[0] != load.at:
                    if seen is None and len(self._seen) >= 2 * len(board.loads) + 64:
                        # engines that left: keep only those the board still has figures of
                        self._seen = {u: v for u, v in self._seen.items() if u in board.loads}
                    seen = self._seen[endpoint.url] = (load.at, open_now)
                room = min(room, seen[1] - open_now)
        return room if room > 0 else 0

    def any_room(self, endpoints: Sequence[Endpoint]) -> bool:
        """Whether any of `endpoints` can take a request now: the fast path, stopping at the first."""
        if not endpoints:
            return True  # no engine: not flow control's to hold (the proxy answers 503 or wakes one)
        now = time.monotonic()
        return any(self.room(e, now) for e in endpoints)

    def total_room(self, endpoints: Sequence[Endpoint]) -> int:
        if not endpoints:
            return UNBOUNDED
        now = time.monotonic()
        total = 0
        for e in endpoints:
            total += self.room(e, now)
            if total >= UNBOUNDED:
                return UNBOUNDED
        return total

    def with_room(self, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        """The engines that can take a request now (a request let out of the queue goes to one)."""
        now = time.monotonic()
        return [e for e in endpoints if self.room(e, now)]
