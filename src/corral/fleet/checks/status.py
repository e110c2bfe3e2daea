"""A compact, changing-only view of a fleet, read from the router's `GET /v1/fleet`."""

from __future__ import annotations

import aiohttp

from corral.clients.access import RouterAdmin
from corral.clients.router import RouterAdminClient
from corral.contracts.router import FleetEndpoint


async def fetch_fleet(session: aiohttp.ClientSession, router_url: str) -> list[FleetEndpoint]:
    """The endpoint list of a loopback router (`corral up`'s); RouterAdminError when it does not answer."""
    return (await RouterAdminClient(session, RouterAdmin(router_url)).fleet()).endpoints


def summary_line(endpoints: list[FleetEndpoint], names: dict[str, str] | None = None) -> str:
    """One line: routable count, then each engine (by name when `names` maps its URL to one) with its
    state and in-flight requests, and why it is not routable."""
    routable = sum(1 for e in endpoints if e.routable)
    parts = []
    for e in endpoints:
        name = (names or {}).get(e.url) or e.url.removeprefix("http://")
        mark = "" if e.routable else ", not routable"
        parts.append(f"{name} {e.state} ({e.in_flight} in flight{mark})")
    return f"{routable}/{len(endpoints)} routable | " + " | ".join(parts)
