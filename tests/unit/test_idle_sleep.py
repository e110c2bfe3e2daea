"""Idle sleep's pure parts: the idle clock (the supervisor's own smoke requests are no traffic), the
--sleep-peer URLs' bounds, and what a peer's /v1/state may say (hostile or malformed answers read as
no answer)."""

from __future__ import annotations

import orjson
import pytest

from corral.engine.load_sample import LoadSample
from corral.supervisor.lifecycle.idle_settings import MAX_PEERS, peer_urls
from corral.supervisor.runbook.idle_sleep import IdleClock, read_peer_state


def load(running: float = 0, waiting: float = 0, finished: float = 0) -> LoadSample:
    return LoadSample(running=running, waiting=waiting, finished=finished, generation_tokens=0, at=0)


def test_the_idle_clock_counts_requests_but_not_the_supervisors_own_smokes() -> None:
    clock = IdleClock(now=0)
    clock.observe(load(finished=5), own=0, open_at_gate=0, now=1)
    assert clock.idle_since == 0  # the first reading is the baseline
    clock.observe(load(finished=6), own=1, open_at_gate=0, now=2)  # its own smoke: still idle
    assert clock.idle_since == 0
    clock.observe(load(finished=7), own=1, open_at_gate=0, now=3)  # a request finished
    assert clock.idle_since == 3
    clock.observe(load(running=1, finished=7), own=1, open_at_gate=0, now=4)
    assert clock.idle_since == 4
    clock.observe(load(finished=7), own=1, open_at_gate=2, now=5)  # open at the gate
    assert clock.idle_since == 5
    clock.observe(load(finished=7), own=1, open_at_gate=0, now=9)
    assert clock.idle_since == 5


def test_a_smoke_answered_before_the_engine_counts_it_is_no_traffic() -> None:
    """The stall watch counts its smoke when the answer comes, before its next reading of the engine's
    `/metrics` (which may count it then or a reading later): the figure dips and comes back, and the clock
    runs on. A request of someone else's still restarts it."""
    clock = IdleClock(now=0)
    clock.observe(load(finished=5), own=0, open_at_gate=0, now=1)
    clock.observe(load(finished=5), own=1, open_at_gate=0, now=2)  # answered, not yet in /metrics
    clock.observe(load(finished=5), own=1, open_at_gate=0, now=3)  # a reading later, still not
    clock.observe(load(finished=6), own=1, open_at_gate=0, now=4)  # now it is
    assert clock.idle_since == 0
    clock.observe(load(finished=6), own=2, open_at_gate=0, now=5)  # another smoke's dip ...
    clock.observe(load(finished=8), own=2, open_at_gate=0, now=6)  # ... and a client's request with it
    assert clock.idle_since == 6
    clock.observe(load(finished=8), own=2, open_at_gate=0, now=9)
    assert clock.idle_since == 6


@pytest.mark.parametrize(
    ("urls", "complaint"),
    [
        (("ftp://h:1",), "http://host:port"),
        (("http://h",), "http://host:port"),
        (("http://h:99999",), "out of range"),
        (("http://u:p@h:1",), "credentials"),
        (("http://h:1/?q=1",), "query"),
        (("http://h:1/" + "a" * 5000,), "longer than 2048"),
        (tuple(f"http://h:{i + 1}" for i in range(MAX_PEERS + 1)), "at most 64"),
    ],
)
def test_sleep_peer_urls_are_bounded(urls: tuple[str, ...], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        peer_urls(urls)


def test_sleep_peer_urls_that_fit() -> None:
    assert peer_urls(("http://10.0.0.2:8081/", "https://sup-b:8081")) == (
        "http://10.0.0.2:8081",
        "https://sup-b:8081",
    )


GOOD = {
    "state": "READY",
    "engine": {"url": "http://e:8000", "model": "m"},
    "idle_sleep": {"idle": True},
    "busy": None,
}


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"state": 1}',
        orjson.dumps({**GOOD, "engine": "x"}),
        orjson.dumps({**GOOD, "engine": {"url": 5}}),
        b"[" * 100_000,
    ],
)
def test_a_peer_state_that_is_not_one_reads_as_no_answer(raw: bytes) -> None:
    assert read_peer_state(raw) is None


def test_a_peer_state_reads_only_what_the_rule_needs() -> None:
    assert read_peer_state(orjson.dumps(GOOD)) == ("READY", "m", "http://e:8000", True, False)
    odd = {
        **GOOD,
        "engine": {"url": "http://e:8000", "model": ["m"]},
        "idle_sleep": {"idle": "yes"},
        "busy": "sleep",
    }
    assert read_peer_state(orjson.dumps(odd)) == ("READY", None, "http://e:8000", False, True)
