"""The router's root (issue 32): a browser that opens `http://127.0.0.1:8000/` is sent to the dashboard,
an API client keeps a JSON 404 that names the router's routes, and `/` is guarded exactly as
/dashboard is (it shows nothing to anyone the dashboard refuses). The page asks for no /favicon.ico:
in a real browser, opening `/` lands on the live dashboard with no failed request and no console
error."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import aiohttp
import orjson
import pytest

from corral.router.app import RouterConfig
from corral.router.edge.admin_access import AdminAccessConfig
from tests.integration.test_router_admin_access import ADMIN_KEY, NO_ENGINE, TENANT_KEY, serve

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8"
CHROMIUM = "/usr/bin/chromium"
HAVE_CHROMIUM = Path(CHROMIUM).exists()


async def fetch(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(url, headers=headers, allow_redirects=False) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.read()


async def test_a_browser_at_the_root_is_sent_to_the_dashboard_an_api_client_gets_json() -> None:
    async for url in serve(RouterConfig(backends=[NO_ENGINE])):
        status, headers, _ = await fetch(url + "/", {"Accept": BROWSER_ACCEPT})
        assert (status, headers["Location"]) == (302, "/dashboard")
        page = await fetch(url + headers["Location"], {"Accept": BROWSER_ACCEPT})
        assert page[0] == 200 and page[1]["Content-Type"].startswith("text/html")
        # curl's */*, an API client's JSON, and Accept values that only look like HTML: the JSON 404
        for accept in ("*/*", "application/json", "", "text/htmlx", "application/json; x=text/html"):
            status, headers, body = await fetch(url + "/", {"Accept": accept} if accept else {})
            assert status == 404 and headers["Content-Type"].startswith("application/json"), accept
            assert "/dashboard" in orjson.loads(body)["error"]["message"], body


async def test_the_root_is_refused_where_the_dashboard_is() -> None:
    admin = AdminAccessConfig(host="0.0.0.0", admin_key_sha256=hashlib.sha256(ADMIN_KEY.encode()).digest())
    async for url in serve(RouterConfig(backends=[NO_ENGINE], admin=admin)):
        for key in (None, "wrong-key", TENANT_KEY):
            auth = {"Authorization": f"Bearer {key}"} if key else {}
            root = await fetch(url + "/", {"Accept": BROWSER_ACCEPT, **auth})
            page = await fetch(url + "/dashboard", {"Accept": BROWSER_ACCEPT, **auth})
            assert (root[0], page[0]) == (401, 401), (key, root[2])
            assert "Location" not in root[1] and NO_ENGINE.encode() not in root[2]
        with_key = {"Accept": BROWSER_ACCEPT, "Authorization": f"Bearer {ADMIN_KEY}"}
        assert (await fetch(url + "/", with_key))[0] == 302
        # another site's page may not use a visitor's browser to reach it, key or not
        foreign = await fetch(url + "/", {**with_key, "Origin": "http://evil.example"})
        assert foreign[0] == 403 and "Location" not in foreign[1], foreign[2]
    # a name that is not loopback (DNS rebinding) is refused as on the dashboard
    async for url in serve(RouterConfig(backends=[NO_ENGINE])):
        rebound = await fetch(url + "/", {"Accept": BROWSER_ACCEPT, "Host": "attacker.example"})
        assert rebound[0] == 403 and "Location" not in rebound[1], rebound[2]


async def test_with_an_admin_port_the_main_ports_root_points_there() -> None:
    admin = AdminAccessConfig(admin_port=9)  # the main listener is not the admin port
    async for url in serve(RouterConfig(backends=[NO_ENGINE], admin=admin)):
        status, headers, body = await fetch(url + "/", {"Accept": BROWSER_ACCEPT})
        assert status == 404 and "Location" not in headers
        assert "admin port (9)" in orjson.loads(body)["error"]["message"], body


def _open_root_in_chromium(url: str, shot: Path) -> tuple[str, list[str], list[str]]:
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    failed: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: failed.append(r.url))
            page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            page.goto(url + "/")
            page.wait_for_selector('#conn[data-state="live"]', timeout=30_000)
            page.screenshot(path=str(shot), full_page=True)
            landed = page.url
        finally:
            browser.close()
    return landed, errors, failed


async def test_in_a_browser_the_root_opens_the_live_dashboard_without_errors(tmp_path: Path) -> None:
    missing = [] if HAVE_CHROMIUM else [CHROMIUM]
    try:
        import playwright  # noqa: F401
    except ImportError:
        missing.append("the playwright package")
    if missing:
        if os.environ.get("CORRAL_REQUIRE_BROWSER"):
            pytest.fail(f"CORRAL_REQUIRE_BROWSER is set but this machine lacks {', '.join(missing)}")
        pytest.skip(f"no browser: missing {', '.join(missing)}")
    async for url in serve(RouterConfig(backends=[NO_ENGINE])):
        shot = tmp_path / "root.png"
        # Playwright's sync API in its own thread: this loop keeps serving the router meanwhile
        landed, errors, failed = await asyncio.to_thread(_open_root_in_chromium, url, shot)
        assert landed == url + "/dashboard"
        assert errors == [] and failed == [], (errors, failed)  # no /favicon.ico 404 among them
