"""Event-loop entry point (every Corral server runs on uvloop), and stopping background tasks."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    return uvloop.run(main)


# Net allocations of tracked objects between young-generation collections (CPython's default: 700).
SERVING_GC_THRESHOLD = 20_000


def settle_heap() -> None:
    """Once a server has started: freeze what startup allocated (imports, config, the app) out of the
    cyclic collector's reach, so that its full collections stop re-walking it, and run young
    collections less often. A request's objects die by reference counting; the collector only
    finds the rare cycle, so collecting it every 700 allocations costs a hot path CPU for nothing."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(SERVING_GC_THRESHOLD, 10, 10)


def new_event_loop() -> asyncio.AbstractEventLoop:
    return uvloop.new_event_loop()


async def cancel_tasks(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel every task given (None is skipped) and wait until each has ended; a task that was
    cancelled ends quietly, one that failed raises its error here."""
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    for task in live:
        with contextlib.suppress(asyncio.CancelledError):
            await task
