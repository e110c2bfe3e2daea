"""What a router keeps from a supervisor's state lines, bounded: the line's bytes (read no further), and
the size of each field it stores on the endpoint and shows in `/v1/fleet`. A supervisor's stream is
untrusted input: a line outside the bounds is refused as a broken stream is (the endpoint leaves
routing, the stream reconnects), never stored.

The bounds are far above what a supervisor writes: a reason is a sentence (an engine's exit, a drain's
cut-short note), identities are hashes or short names, addresses `tcp://host:port,tcp://host:port`.
"""

from __future__ import annotations

from corral.contracts.supervisor import OperationInFlight, StateLine

# One line of the watch stream: a state line carries evidence (a drain report).
MAX_LINE_BYTES = 1 << 20
MAX_REASON_CHARS = 16 << 10
MAX_FIELD_CHARS = 1024  # sub_state, fingerprint, prefix_epoch, role, pairing, connector, kv_events, operation
MAX_WITHDRAWN = 4096  # adapters a READY line withdraws
MAX_ADAPTER_CHARS = 1024


class StateLineRefused(ValueError):
    """A state line outside the bounds: which field, how large, the bound; never the value."""


def check_state_line(line: StateLine) -> None:
    """Raise StateLineRefused naming the first field of `line` outside the bounds."""
    _check("reason", line.reason, MAX_REASON_CHARS)
    for name in ("sub_state", "fingerprint", "prefix_epoch", "role", "pairing", "connector", "kv_events"):
        _check(name, getattr(line, name), MAX_FIELD_CHARS)
    check_operation(line.operation)
    listed = line.evidence.get("withdrawn_adapters")
    if isinstance(listed, list):
        if len(listed) > MAX_WITHDRAWN:
            raise StateLineRefused(f"withdrawn_adapters lists {len(listed)} (at most {MAX_WITHDRAWN})")
        for name in listed:
            if isinstance(name, str):
                _check("a withdrawn adapter", name, MAX_ADAPTER_CHARS)


def check_operation(operation: OperationInFlight | None) -> None:
    if operation is not None:
        for name in ("kind", "id", "detail", "step"):
            _check(f"operation.{name}", getattr(operation, name), MAX_FIELD_CHARS)


def _check(name: str, value: str | None, limit: int) -> None:
    if value is not None and len(value) > limit:
        raise StateLineRefused(f"{name} of {len(value)} characters (at most {limit})")
