"""The W3C Trace Context headers (`traceparent`, `tracestate`) a request brings and the one Corral sends
on: read within fixed bounds (a `traceparent` of at most MAX_TRACEPARENT_CHARS, a `tracestate` of at most
MAX_TRACESTATE_CHARS and MAX_TRACESTATE_MEMBERS members); a malformed or oversized header is ignored (the
request starts a trace of its own), never an error for the client."""

from __future__ import annotations

import re

from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState, set_span_in_context

MAX_TRACEPARENT_CHARS = 256  # version 00 is 55; a later version may append fields
MAX_TRACESTATE_CHARS = 512  # the size W3C asks every vendor to propagate at least
MAX_TRACESTATE_MEMBERS = 32  # W3C's limit
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
# a tracestate member, as W3C writes it: a key (`vendor` or `tenant@vendor`) = a value of printable ASCII
# but `,` and `=`, not ending in a space. Checked here: the SDK's own parser logs each bad member.
_KEY = r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
_MEMBER = re.compile(_KEY + r"=([\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e])")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


def parent_of(traceparent: str | None, tracestate: str | None) -> SpanContext | None:
    """The remote parent the headers name, or None (absent, malformed, oversized, all-zero ids,
    version ff, or version 00 with more fields)."""
    if traceparent is None or len(traceparent) > MAX_TRACEPARENT_CHARS:
        return None
    match = _TRACEPARENT.fullmatch(traceparent.strip())
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_hex == _ZERO_TRACE or span_hex == _ZERO_SPAN:
        return None
    return SpanContext(
        trace_id=int(trace_hex, 16),
        span_id=int(span_hex, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(flags_hex, 16) & 0x01),
        trace_state=state_of(tracestate),
    )


def state_of(tracestate: str | None) -> TraceState:
    """The vendors' `tracestate` list, or an empty one when it is absent, oversized or malformed."""
    if not tracestate or len(tracestate) > MAX_TRACESTATE_CHARS:
        return TraceState()
    members = [member.strip(" \t") for member in tracestate.split(",")]
    members = [member for member in members if member]
    if len(members) > MAX_TRACESTATE_MEMBERS:
        return TraceState()
    pairs: dict[str, str] = {}
    for member in members:
        if _MEMBER.fullmatch(member) is None:
            return TraceState()
        key, _, value = member.partition("=")
        if key in pairs:  # a key twice: the whole list is invalid
            return TraceState()
        pairs[key] = value
    return TraceState(list(pairs.items()))


def remote_context(parent: SpanContext | None) -> Context | None:
    """A context whose current span is the remote parent (for `start_span(context=...)`)."""
    return None if parent is None else set_span_in_context(NonRecordingSpan(parent))


def traceparent_of(context: SpanContext) -> str:
    """The `traceparent` that makes the next hop's spans children of `context`."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags) & 0x01:02x}"


def propagation_headers(context: SpanContext) -> list[tuple[str, str]]:
    """`traceparent`, and `tracestate` when the trace carries one."""
    headers = [("traceparent", traceparent_of(context))]
    state = context.trace_state.to_header() if context.trace_state else ""
    if state:
        headers.append(("tracestate", state))
    return headers
