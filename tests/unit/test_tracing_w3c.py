"""The W3C trace headers a client sends: read within their bounds, anything malformed or oversized
ignored (the request starts its own trace) without a log line per bad header."""

from __future__ import annotations

import logging

import pytest

from corral.tracing.w3c import (
    MAX_TRACEPARENT_CHARS,
    MAX_TRACESTATE_CHARS,
    MAX_TRACESTATE_MEMBERS,
    parent_of,
    propagation_headers,
    state_of,
    traceparent_of,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
GOOD = f"00-{TRACE}-{SPAN}-01"


def test_a_valid_traceparent_is_the_remote_parent_and_goes_back_out_as_it_came() -> None:
    parent = parent_of(GOOD, "a=1,b@c=2")
    assert parent is not None and parent.is_remote and parent.trace_flags.sampled
    assert (f"{parent.trace_id:032x}", f"{parent.span_id:016x}") == (TRACE, SPAN)
    assert traceparent_of(parent) == GOOD
    assert propagation_headers(parent) == [("traceparent", GOOD), ("tracestate", "a=1,b@c=2")]
    unsampled = parent_of(f"00-{TRACE}-{SPAN}-00", None)
    assert unsampled is not None and not unsampled.trace_flags.sampled
    assert parent_of(f"01-{TRACE}-{SPAN}-01-later-fields", None) is not None  # a later version's fields


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        GOOD.upper(),
        GOOD + "-extra",  # version 00 has exactly four fields
        f"ff-{TRACE}-{SPAN}-01",
        f"00-{'0' * 32}-{SPAN}-01",
        f"00-{TRACE}-{'0' * 16}-01",
        f"00-{TRACE[:-1]}-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-1",
        "00-" + "a" * 100_000 + f"-{SPAN}-01",
        f"01-{TRACE}-{SPAN}-01-" + "x" * MAX_TRACEPARENT_CHARS,
        f"00-{TRACE}\n-{SPAN}-01",
    ],
)
def test_a_malformed_or_oversized_traceparent_is_ignored(value: str) -> None:
    assert parent_of(value, "a=1") is None


@pytest.mark.parametrize(
    "value",
    [
        "k=" + "v" * MAX_TRACESTATE_CHARS,
        ",".join(f"k{i}=v" for i in range(MAX_TRACESTATE_MEMBERS + 1)),
        "UPPER=1",
        "a=1,a=2",
        "a=1,b",
        "a=x=y",
        "a=1,\x00=2",
    ],
)
def test_a_malformed_or_oversized_tracestate_is_dropped_without_a_log_line(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    assert state_of(value).to_header() == ""
    parent = parent_of(GOOD, value)
    assert parent is not None and len(parent.trace_state) == 0  # the traceparent still counts
    assert caplog.records == []


def test_the_most_members_and_the_longest_keys_pass() -> None:
    members = ",".join(f"k{i}=v" for i in range(MAX_TRACESTATE_MEMBERS))
    assert len(state_of(members)) == MAX_TRACESTATE_MEMBERS
    assert len(state_of(" a=1 , , t@s=x y")) == 2  # optional spaces and empty members
