"""Read timeouts for the upstream client without a timer per wait: every wait of one client lasts the
same number of seconds, so deadlines expire in the order the waits began, and one event-loop timer,
armed for the oldest wait still pending, serves them all."""

from __future__ import annotations

import asyncio


class Deadlines:
    """Fails a registered future with TimeoutError once it has waited `seconds`.

    A wait that ends in time is dropped from an insertion-ordered dict (O(1)); the single timer is
    re-armed only when it fires, for the oldest wait left, so a steady stream of quick answers costs no
    timer work at all.
    """

    __slots__ = ("_loop", "_pending", "_timer", "seconds")

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"a read timeout must be positive seconds, not {seconds!r}")
        self.seconds = seconds
        self._pending: dict[asyncio.Future[None], float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, waiter: asyncio.Future[None]) -> None:
        """Start the clock on `waiter`; call `done(waiter)` when the wait ends, however it ends."""
        loop = waiter.get_loop()
        if loop is not self._loop:  # the first wait, or a client reused on a new event loop
            self.close()
            self._loop = loop
        deadline = loop.time() + self.seconds
        self._pending[waiter] = deadline
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)

    def done(self, waiter: asyncio.Future[None]) -> None:
        self._pending.pop(waiter, None)

    def _expire(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        pending = self._pending
        while pending:
            waiter, deadline = next(iter(pending.items()))
            if deadline > now:
                self._timer = loop.call_at(deadline, self._expire)
                return
            del pending[waiter]
            if not waiter.done():
                waiter.set_exception(TimeoutError(f"no answer within {self.seconds:g} s"))

    def close(self) -> None:
        """Stop the timer; pending waits are left to whoever closes their connections."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending.clear()

    def __len__(self) -> int:
        return len(self._pending)
