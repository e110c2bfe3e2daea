"""A compact, changing-only view of a fleet, read from the router's `GET /v1/fleet`."""

from __future__ import annotations

from typing import Any

import aiohttp

from corral.clients.access import RouterAdmin


async def fetch_fleet(session: aiohttp.ClientSession, router_url: str) -> list[dict[str, Any]]:
    """The endpoint list of a loopback router (`corral up`'s); RouterAdminError when it does not answer."""
    return await RouterAdmin(router_url).endpoints(session)


def summary_line(endpoints: list[dict[str, Any]]) -> str:
    """One line: routable count, then each endpoint's state and in-flight requests."""
    routable = sum(1 for e in endpoints if e.get("routable"))
    parts = []
    for e in endpoints:
        url = str(e.get("url", "?")).removeprefix("http://")
        state = e.get("state", "?")
        mark = "" if e.get("routable") else " (not routable: " + str(e.get("reason") or "-") + ")"
        parts.append(f"{url} {state} in_flight={e.get('in_flight', 0)}{mark}")
    return f"{routable}/{len(endpoints)} routable | " + " | ".join(parts)
