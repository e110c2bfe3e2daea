"""Running a load: requests started at a fixed rate (open loop) or by a fixed number of clients
(closed loop), until the count or the time is reached or the user stops it, then the requests still in
flight waited for (after a stop, only for a short grace: what is left is counted as unfinished)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from corral.fleet.load.request import chat_body, send_chat
from corral.fleet.load.tally import LoadTally, RequestOutcome

# a rate's requests in flight at most: a router that stops answering slows the load down instead of
# opening a connection for every request due
MAX_IN_FLIGHT = 512  # well under the usual 1024 open files a process may hold


@dataclass(frozen=True)
class LoadPlan:
    """What to send: `rate` requests a second or `concurrency` clients (exactly one of them), for at
    most `seconds` and `max_requests`; `stream_share` of them streamed, spread evenly."""

    url: str  # the router's /v1/chat/completions
    model: str
    seconds: float
    max_requests: int
    stream_share: float
    rate: float | None = None
    concurrency: int | None = None
    max_tokens: int = 16
    request_timeout: float = 60.0
    grace: float = 5.0  # how long a stopped load waits for the requests in flight
    headers: Mapping[str, str] | None = None

    def streamed(self, number: int) -> bool:
        """Request `number` is streamed when it carries the running share past a whole request: over any
        run of requests the streamed count is within one of `stream_share` times their number."""
        return math.floor((number + 1) * self.stream_share) > math.floor(number * self.stream_share)


async def _first(stop: asyncio.Event, other: asyncio.Future[Any] | None, seconds: float) -> None:
    """Wait until `stop` is set, `other` is done, or `seconds` have passed."""
    waiter = asyncio.ensure_future(stop.wait())
    pending = {waiter} | ({other} if other is not None else set())
    await asyncio.wait(pending, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()


async def run_load(
    plan: LoadPlan,
    session: aiohttp.ClientSession,
    stop: asyncio.Event,
    progress: Callable[[LoadTally, float, float], None],
) -> tuple[LoadTally, float]:
    """Send `plan`'s load; `progress(tally, elapsed, window)` is called about once a second. Returns the
    tally and the seconds it took."""
    tally = LoadTally()
    inflight: set[asyncio.Task[None]] = set()
    slots = asyncio.Semaphore(plan.concurrency or MAX_IN_FLIGHT)
    timeout = aiohttp.ClientTimeout(total=plan.request_timeout)
    headers = {"Content-Type": "application/json", **(plan.headers or {})}
    start = time.monotonic()
    deadline = start + plan.seconds

    async def one(number: int, streamed: bool) -> None:
        try:
            body = chat_body(plan.model, number, streamed, plan.max_tokens)
            begun = time.monotonic()
            try:
                outcome = await send_chat(session, plan.url, body, streamed, headers, timeout)
            except Exception as exc:  # every request sent is counted, however it ended
                outcome = RequestOutcome(
                    time.monotonic() - begun, streamed, f"client error ({type(exc).__name__})"
                )
            tally.ended(outcome)
        finally:
            slots.release()

    async def next_turn(number: int) -> bool:
        """Wait until request `number` is due (rate) and a client is free (concurrency, or the ceiling
        on a rate's requests in flight); False when the load is over instead: stopped, out of time."""
        if plan.rate is not None:
            await _first(stop, None, min(start + number / plan.rate, deadline) - time.monotonic())
        acquire = asyncio.ensure_future(slots.acquire())
        await _first(stop, acquire, deadline - time.monotonic())
        if not acquire.done():
            acquire.cancel()
            return False
        if stop.is_set() or time.monotonic() >= deadline:
            slots.release()
            return False
        return True

    async def send() -> None:
        for number in range(plan.max_requests):
            if not await next_turn(number):
                return
            streamed = plan.streamed(number)
            tally.started(streamed)
            task = asyncio.create_task(one(number, streamed))
            inflight.add(task)
            task.add_done_callback(inflight.discard)

    async def tick() -> None:
        last = start
        while True:
            await asyncio.sleep(max(0.0, last + 1.0 - time.monotonic()))
            now = time.monotonic()
            progress(tally, now - start, now - last)
            last = now

    ticker = asyncio.create_task(tick())
    try:
        await send()
        if inflight and not stop.is_set():  # the load's end: every request ends within its timeout
            everything = asyncio.ensure_future(asyncio.wait(set(inflight)))
            await _first(stop, everything, plan.request_timeout + plan.grace)
            everything.cancel()
        left = {task for task in inflight if not task.done()}
        if left:  # stopped by the user: a short grace, then what is left is unfinished
            _, left = await asyncio.wait(left, timeout=plan.grace)
            tally.unfinished = len(left)
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
    return tally, time.monotonic() - start
