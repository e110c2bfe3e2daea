"""Event-loop entry point (every Corral server runs on uvloop), and stopping background tasks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    return uvloop.run(main)


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
