"""The upstream client's shared read deadlines and the router's own request ids."""

from __future__ import annotations

import asyncio
import re

import pytest

from corral.router.datapath.deadlines import Deadlines
from corral.router.datapath.request_ids import RequestIds


async def test_a_wait_past_its_deadline_fails_and_one_answered_in_time_does_not() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(0.05)
    answered, silent = loop.create_future(), loop.create_future()
    deadlines.watch(answered)
    deadlines.watch(silent)
    answered.set_result(None)
    deadlines.done(answered)
    with pytest.raises(TimeoutError, match=r"0\.05 s"):
        await silent
    assert len(deadlines) == 0
    deadlines.close()


async def test_the_one_timer_is_rearmed_for_waits_that_began_later() -> None:
    # the timer armed for the first wait fires after that wait ended; the later wait must still expire
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(0.05)
    first = loop.create_future()
    deadlines.watch(first)
    first.set_result(None)
    deadlines.done(first)
    await asyncio.sleep(0.02)
    later = loop.create_future()
    deadlines.watch(later)
    with pytest.raises(TimeoutError):
        await later
    # and a wait watched after everything expired gets a timer of its own
    again = loop.create_future()
    deadlines.watch(again)
    with pytest.raises(TimeoutError):
        await again
    deadlines.close()


async def test_waits_expire_oldest_first_and_leave_the_younger_pending() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(0.05)
    old = loop.create_future()
    deadlines.watch(old)
    await asyncio.sleep(0.04)
    young = loop.create_future()
    deadlines.watch(young)
    with pytest.raises(TimeoutError):
        await old
    assert not young.done() and len(deadlines) == 1
    with pytest.raises(TimeoutError):
        await young
    deadlines.close()


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
