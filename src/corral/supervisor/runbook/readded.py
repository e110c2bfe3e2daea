"""After a wake, the routers confirm they route to the engine again: each router subscribed when the
engine went READY acknowledges that READY epoch (`POST /v1/acks`, state READY) once the endpoint is
back in its routing table. POSTCHECK waits for them, bounded by the propagation timeout, as a drain
waits for the removal's acknowledgements.

The evidence names the routers that re-added the engine (with the acknowledgement's latency), those
whose stream closed meanwhile (gone: a router that subscribes again reads READY as its first line and
routes on it) and those that had not acknowledged at the bound (missing). A missing router does not
fail the wake: the engine serves, the routers that re-added it send it traffic, and RECOVER (a restart
in place) would cut that traffic; the router is named in the change record and the log instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from corral.supervisor.lifecycle.routers import RouterSubscriptions
from corral.supervisor.runbook.template import Evidence

POLL_SECONDS = 0.5  # at most between two looks; an acknowledgement or a stream closing wakes it sooner


@dataclass(frozen=True)
class Readding:
    """What VERIFY saw when it made the engine READY again: that epoch and the routers subscribed."""

    epoch: int
    awaited: tuple[str, ...]

    @classmethod
    def now(cls, routers: RouterSubscriptions, epoch: int) -> Readding:
        return cls(epoch, tuple(routers.subscribed()))


async def confirm_readded(
    routers: RouterSubscriptions, readding: Readding, within: float, log: Callable[[str], None]
) -> Evidence:
    """Wait up to `within` s for every awaited router still subscribed to acknowledge `readding.epoch`."""
    started = time.monotonic()
    deadline = started + within
    while True:
        routers.arm()
        subscribed = set(routers.subscribed())
        missing = [
            r for r in readding.awaited if r in subscribed and routers.acknowledged(r, readding.epoch) is None
        ]
        left = deadline - time.monotonic()
        if not missing or left <= 0:
            break
        await routers.changed(min(POLL_SECONDS, left))
    acks = {r: a for r in readding.awaited if (a := routers.acknowledged(r, readding.epoch)) is not None}
    gone = [r for r in readding.awaited if r not in acks and r not in subscribed]
    seconds = round(time.monotonic() - started, 3)
    if missing:
        log(
            f"wake: routers {', '.join(missing)} did not acknowledge the engine back in routing (epoch "
            f"{readding.epoch}) within {within:g}s; the engine serves, those routers may not send it "
            "traffic yet (their /v1/fleet says why)"
        )
    else:
        log(
            f"wake: every subscribed router ({len(acks)}) has the engine back in routing (epoch "
            f"{readding.epoch}) after {seconds:g}s"
        )
    return {
        "ready_epoch": readding.epoch,
        "routers_readded": [{"router_id": r, "latency_s": a.latency_s} for r, a in acks.items()],
        "routers_gone": gone,
        "routers_missing": missing,
        "seconds": seconds,
    }
