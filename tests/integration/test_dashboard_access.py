"""/dashboard and /dashboard/events are admin routes, refused exactly as /v1/fleet is; open to a
loopback client of a loopback router, where the feed carries the same endpoints /v1/fleet shows."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import orjson

from corral.router.app import RouterConfig
from tests.integration.test_router_admin_access import (  # noqa: F401 - beyond_loopback is a fixture
    ADMIN_KEY,
    NO_ENGINE,
    TENANT_KEY,
    beyond_loopback,
    get,
    serve,
)

DASHBOARD_ROUTES = ("/dashboard", "/dashboard/events", "/dashboard/series")


async def first_event(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(url + "/dashboard/events") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        buffer = b""
        while b"\n\n" not in buffer.partition(b"event: fleet\n")[2]:
            buffer += await asyncio.wait_for(resp.content.readany(), 10)
        data = buffer.partition(b"event: fleet\ndata: ")[2].partition(b"\n\n")[0]
        parsed: dict[str, Any] = orjson.loads(data)
        return parsed


async def test_on_a_loopback_router_the_page_and_its_feed_show_the_fleet() -> None:
    async for url in serve(RouterConfig(backends=[NO_ENGINE])):
        status, headers, body = await get(url + "/dashboard")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert b"EventSource" in body and b"/*JS*/" not in body  # CSS and JS inlined from package data
        # the charting library too, from the package: the page names no other origin to load from
        assert b"uPlot" in body and b"/*UPLOT_JS*/" not in body and b"/*CHARTS_JS*/" not in body
        assert not re.findall(rb"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", body)
        status, _, series = await get(url + "/dashboard/series")
        assert status == 200
        points = orjson.loads(series)  # the router ticks from its start: a point is there at once
        assert points["step_s"] == 5 and len(points["times"]) >= 1
        assert list(points["engines"]) == [NO_ENGINE] and "rate" in points["engines"][NO_ENGINE]
        event = await first_event(url)
        assert [e["url"] for e in event["endpoints"]] == [NO_ENGINE]
        assert event["endpoints"][0]["routable"] is False


async def test_beyond_loopback_they_are_refused_like_the_fleet_route(beyond_loopback: str) -> None:  # noqa: F811
    for path in DASHBOARD_ROUTES:
        for key in (None, "wrong-key", TENANT_KEY):
            status, _, body = await get(beyond_loopback + path, key)
            fleet_status, _, fleet_body = await get(beyond_loopback + "/v1/fleet", key)
            assert (status, fleet_status) == (401, 401), (path, key, body)
            assert orjson.loads(body)["error"]["type"] == orjson.loads(fleet_body)["error"]["type"]
            assert b"127.0.0.1:9" not in body
    status, _, body = await get(beyond_loopback + "/dashboard", ADMIN_KEY)
    assert status == 200, body
