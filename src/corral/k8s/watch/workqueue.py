"""A keyed work queue (client-go's workqueue, in asyncio): event intake puts the latest state of a
key, workers take keys one at a time. A key is never handed to two workers at once; a key put
again while a worker holds it comes back after `done`, with its latest state, so nothing put is
lost — a deletion included — while intermediate states nobody has taken yet are skipped.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class QueueShutDown(Exception):
    """`get` on a queue that was shut down."""


class KeyedQueue(Generic[K, V]):
    def __init__(self) -> None:
        self._latest: dict[K, V] = {}  # key -> newest state not yet handed out
        self._order: deque[K] = deque()  # keys ready to hand out, each at most once
        self._processing: set[K] = set()
        self._wakeup = asyncio.Event()
        self._shut = False

    def put(self, key: K, state: V) -> None:
        """Record `state` as the newest for `key`; replaces any state not yet taken."""
        fresh = key not in self._latest
        self._latest[key] = state
        if fresh and key not in self._processing:
            self._order.append(key)
            self._wakeup.set()

    async def get(self) -> tuple[K, V]:
        """The next key and its newest state; the caller must call `done(key)` afterwards."""
        while not self._order:
            if self._shut:
                raise QueueShutDown
            self._wakeup.clear()
            await self._wakeup.wait()
        key = self._order.popleft()
        state = self._latest.pop(key)
        self._processing.add(key)
        return key, state

    def done(self, key: K) -> None:
        """The worker finished `key`; if it was put again meanwhile, it is queued again now."""
        self._processing.discard(key)
        if key in self._latest:
            self._order.append(key)
            self._wakeup.set()

    def pending(self, key: K) -> V | None:
        """The newest state of `key` not yet taken, if any."""
        return self._latest.get(key)

    def shut_down(self) -> None:
        self._shut = True
        self._wakeup.set()

    def __len__(self) -> int:
        return len(self._order)

    @property
    def processing(self) -> frozenset[K]:
        return frozenset(self._processing)
