"""Bounded waits for tests: poll until a condition holds or a deadline passes, then fail saying what.
`wait_until` blocks (a test outside an event loop); `eventually` awaits (a test on the loop, where a
blocking wait would stop what it waits for); `eventually_awaited` awaits a condition that is itself a
coroutine (one that asks a server)."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def eventually(condition: Callable[[], object], what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.01)


async def eventually_awaited(
    condition: Callable[[], Awaitable[bool]], what: str, within: float = 10.0, interval: float = 0.02
) -> None:
    deadline = time.monotonic() + within
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(interval)


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The status `url` answers with, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None


def wait_http_200(url: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise AssertionError(f"process behind {url} exited before it answered")
        if http_status(url) == 200:
            return
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer 200 within {timeout}s")
