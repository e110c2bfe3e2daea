"""Event-loop entry point: every Corral server runs on uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    return uvloop.run(main)


def new_event_loop() -> asyncio.AbstractEventLoop:
    return uvloop.new_event_loop()
