"""What a drain's report says of the requests its stop cut or aborted: the admission gate's forced
exits since the drain began, each with its request id and whether tokens had reached the client, up
to `FORCED_EXITS_LISTED` and a count of the rest; or, without a gate, that they were not observable
(never an empty list, which would read as "none")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

FORCED_EXITS_LISTED = 100  # a drain report lists this many; the oplog has a forced_exit record for each
SETTLE_SECONDS = 5.0  # after the engine's exit, for the gate to see the requests still open end
OPEN_AFTER_EXIT = "open_after_exit"  # still open at the gate after SETTLE_SECONDS: cut, not yet seen
NO_GATE = (
    "no admission gate (--gate-port): clients reach the engine directly, so the requests its stop cut "
    "are known only by count (cut_short), not by request id nor whether tokens had been sent"
)


class ForcedExitRecord(Protocol):
    def to_json(self) -> dict[str, Any]: ...


class RequestWatch(Protocol):
    """What a drain needs of the admission gate's in-flight requests
    (`corral.supervisor.http.inflight.InFlightRequests`)."""

    def mark(self) -> int: ...

    def open(self) -> Sequence[object]:
        """The requests the gate is still relaying (a drain waits for them too)."""
        ...

    def forced_since(self, mark: int) -> Sequence[ForcedExitRecord]: ...

    async def settle(self, within: float) -> Sequence[ForcedExitRecord]: ...


NamedExits = tuple[list[dict[str, Any]] | None, int, str | None]  # listed, not listed, why unobserved


async def name_forced_exits(
    watch: RequestWatch | None, mark: int, log: Callable[[str], None], settle: float = SETTLE_SECONDS
) -> NamedExits:
    """After the engine's stop: the forced exits since `mark`, and the requests still open at the gate
    once it has had `settle` seconds to see them end (how: open_after_exit)."""
    if watch is None:
        return None, 0, NO_GATE
    still_open = await watch.settle(settle)
    listed = [e.to_json() for e in watch.forced_since(mark)]
    listed += [{**e.to_json(), "how": OPEN_AFTER_EXIT} for e in still_open]
    if listed:
        emitted = sum(1 for e in listed if e.get("tokens_emitted"))
        log(
            f"drain: {len(listed)} requests through the gate were cut or aborted, {emitted} after tokens "
            "had been sent: "
            + ", ".join(str(e.get("request_id")) for e in listed[:10])
            + (" …" if len(listed) > 10 else "")
        )
    return listed[:FORCED_EXITS_LISTED], max(0, len(listed) - FORCED_EXITS_LISTED), None
