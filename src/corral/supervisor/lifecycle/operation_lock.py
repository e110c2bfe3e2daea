"""The engine's operation lock: one runbook operation holds the engine at a time, from its PRECHECK
to its last step; `/v1/state` shows the holder as `busy`."""

from __future__ import annotations


class EngineHeld(Exception):
    """Another operation holds the engine; the message names it."""


class OperationLock:
    """Not an `asyncio.Lock`: a second operation is refused at once (HTTP 409), never queued, and
    the lock passes from the request that ran PRECHECK to the task that runs the operation."""

    def __init__(self) -> None:
        self._holder: str | None = None

    @property
    def holder(self) -> str | None:
        return self._holder

    def take(self, holder: str) -> None:
        if self._holder is not None:
            raise EngineHeld(f"operation {self._holder} holds the engine; wait for it to finish")
        self._holder = holder

    def hand_over(self, holder: str) -> None:
        """The taker names itself again (the operation's id is known once it is accepted)."""
        assert self._holder is not None, "take() first"
        self._holder = holder

    def release(self) -> None:
        self._holder = None
