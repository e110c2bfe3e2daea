"""The requests in flight through the admission gate, each by its request id with a first-token flag,
and the forced exits among those that ended: a stream cut by the engine's stop or a connection
failure, or finished by the engine's abort. A forced exit is counted by whether tokens had reached the
client, handed to the gate's listener (the oplog's `forced_exit` record) and kept, numbered, for the
drain report to list those since its stop began."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

KEEP_FORCED = 10_000  # forced exits kept for a drain report; older ones are in the oplog


@dataclass
class InFlightRequest:
    """One request forwarded to the engine and not yet finished."""

    request_id: str
    path: str
    model: str | None
    started: float = field(default_factory=time.time)
    tokens_emitted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "path": self.path,
            "model": self.model,
            "started": self.started,
            "tokens_emitted": self.tokens_emitted,
        }


@dataclass(frozen=True)
class ForcedExit:
    """A request the engine's side ended: `how` is cut (the connection to the engine failed or closed
    before the answer was complete) or engine_abort (a choice finished with reason abort)."""

    request: InFlightRequest
    how: str
    ended: float
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**self.request.to_json(), "how": self.how, "ended": self.ended, "detail": self.detail}


ForcedExitListener = Callable[[ForcedExit], None]


class InFlightRequests:
    def __init__(self, listener: ForcedExitListener | None = None, keep: int = KEEP_FORCED) -> None:
        self._open: dict[int, InFlightRequest] = {}  # by object id: a client may reuse a request id
        self._listener = listener
        self.forced = Counter[bool]()  # forced exits by tokens_emitted, since the gate started
        self._recent: deque[tuple[int, ForcedExit]] = deque(maxlen=keep)
        self._numbers = itertools.count(1)
        self._last = 0
        self._changed = asyncio.Event()

    def begin(self, request_id: str, path: str, model: str | None) -> InFlightRequest:
        entry = InFlightRequest(request_id, path, model)
        self._open[id(entry)] = entry
        return entry

    def end(self, entry: InFlightRequest, how: str | None, detail: str = "") -> ForcedExit | None:
        """`entry` finished; `how` names a forced exit (None: it ended normally or its client left).
        An entry already ended is left as it was."""
        if self._open.pop(id(entry), None) is None:
            return None
        self._changed.set()
        if how is None:
            return None
        forced = ForcedExit(entry, how, time.time(), detail)
        self.forced[entry.tokens_emitted] += 1
        self._last = next(self._numbers)
        self._recent.append((self._last, forced))
        if self._listener is not None:
            self._listener(forced)
        return forced

    def open(self) -> list[InFlightRequest]:
        return list(self._open.values())

    def mark(self) -> int:
        """A point to list forced exits from (`forced_since`)."""
        return self._last

    def forced_since(self, mark: int) -> list[ForcedExit]:
        return [forced for number, forced in self._recent if number > mark]

    async def settle(self, within: float) -> list[InFlightRequest]:
        """Wait up to `within` s for every request open now to end; those still open after it."""
        waiting = dict(self._open)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while any(key in self._open for key in waiting):
            left = deadline - loop.time()
            if left <= 0:
                break
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                break
        return [entry for key, entry in waiting.items() if key in self._open]
