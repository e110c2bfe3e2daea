"""A compact, changing-only view of a fleet, read from the router's `GET /v1/fleet`."""

from __future__ import annotations

import aiohttp

from corral.clients.access import RouterAdmin
from corral.clients.router import RouterAdminClient
from corral.contracts.router import FleetEndpoint


async def fetch_fleet(session: aiohttp.ClientSession, router_url: str) -> list[FleetEndpoint]:
    """The endpoint list of a loopback router (`corral up`'s); RouterAdminError when it does not answer."""
    return (await RouterAdminClient(session, RouterAdmin(router_url)).fleet()).endpoints


def summary_line(endpoints: list[FleetEndpoint]) -> str:
    """One line: routable count, then each endpoint's state and in-flight requests."""
    routable = sum(1 for e in endpoints if e.routable)
    parts = []
    for e in endpoints:
        url = e.url.removeprefix("http://")
        mark = "" if e.routable else " (not routable: " + (e.reason or "-") + ")"
        parts.append(f"{url} {e.state} in_flight={e.in_flight}{mark}")
    return f"{routable}/{len(endpoints)} routable | " + " | ".join(parts)
