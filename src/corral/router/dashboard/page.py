"""GET /dashboard and its static files, read once from the package's data."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib.resources import files

from aiohttp import web

_TYPES = {"html": "text/html", "css": "text/css", "js": "text/javascript"}


def _read(name: str) -> bytes:
    return files("corral.router.dashboard").joinpath("static", name).read_bytes()


def page_handler() -> Callable[[web.Request], Awaitable[web.Response]]:
    """One handler serving the page with its CSS and JS inlined (one admin route, one request)."""
    html = _read("dashboard.html").decode("utf-8")
    html = html.replace("/*CSS*/", _read("dashboard.css").decode("utf-8"))
    html = html.replace("/*JS*/", _read("dashboard.js").decode("utf-8"))
    body = html.encode("utf-8")

    async def dashboard(request: web.Request) -> web.Response:
        return web.Response(
            body=body,
            content_type="text/html",
            charset="utf-8",
            headers={
                "Cache-Control": "no-store",
                "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                "script-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
                "X-Frame-Options": "DENY",
            },
        )

    return dashboard
