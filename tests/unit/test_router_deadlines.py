"""The upstream client's shared read deadlines and the router's own request ids."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from corral.router.datapath.deadlines import Deadlines
from corral.router.datapath.request_ids import RequestIds


class ClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the test moves it: the one timer fires exactly when
    the test says its deadline has come, however slow the machine is. Its times are sums of halves and
    quarters, exact in binary, so a deadline is never a rounding error past the time set."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        return self.now


def on_clock(body: Callable[[ClockLoop], Coroutine[Any, Any, None]]) -> None:
    loop = ClockLoop()
    try:
        loop.run_until_complete(body(loop))
    finally:
        loop.close()


async def settle() -> None:
    """Let the loop run what is due at its clock's time (a timer, then the callbacks it woke)."""
    for _ in range(3):
        await asyncio.sleep(0)


def test_a_wait_past_its_deadline_fails_and_one_answered_in_time_does_not() -> None:
    async def body(loop: ClockLoop) -> None:
        deadlines = Deadlines(0.5)
        answered, silent = loop.create_future(), loop.create_future()
        deadlines.watch(answered)
        deadlines.watch(silent)
        answered.set_result(None)
        deadlines.done(answered)
        loop.now = 0.375
        await settle()
        assert not silent.done()
        loop.now = 0.5
        with pytest.raises(TimeoutError, match=r"0\.5 s"):
            await silent
        assert len(deadlines) == 0
        deadlines.close()

    on_clock(body)


def test_the_one_timer_is_rearmed_for_waits_that_began_later() -> None:
    # the timer armed for the first wait fires after that wait ended; the later wait must still expire
    async def body(loop: ClockLoop) -> None:
        deadlines = Deadlines(0.5)
        first = loop.create_future()
        deadlines.watch(first)
        first.set_result(None)
        deadlines.done(first)
        loop.now = 0.25
        later = loop.create_future()
        deadlines.watch(later)  # due at 0.75; the timer still waits for 0.5
        loop.now = 0.5
        await settle()
        assert not later.done()  # the timer fired for the ended wait and was re-armed
        loop.now = 0.75
        with pytest.raises(TimeoutError):
            await later
        # and a wait watched after everything expired gets a timer of its own
        again = loop.create_future()
        deadlines.watch(again)
        loop.now = 1.25
        with pytest.raises(TimeoutError):
            await again
        deadlines.close()

    on_clock(body)


def test_waits_expire_oldest_first_and_leave_the_younger_pending() -> None:
    async def body(loop: ClockLoop) -> None:
        deadlines = Deadlines(0.5)
        old = loop.create_future()
        deadlines.watch(old)
        loop.now = 0.25
        young = loop.create_future()
        deadlines.watch(young)
        loop.now = 0.5
        with pytest.raises(TimeoutError):
            await old
        assert not young.done() and len(deadlines) == 1
        loop.now = 0.75
        with pytest.raises(TimeoutError):
            await young
        deadlines.close()

    on_clock(body)


def test_a_read_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Deadlines(0)


def test_request_ids_are_32_hex_digits_unique_within_and_across_processes() -> None:
    ids = RequestIds()
    made = [ids.new() for _ in range(1000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in made)
    assert len(set(made)) == len(made)
    other = RequestIds()  # another worker, or the router after a restart
    assert other.new() not in made
