"""GET /dashboard and its static files, read once from the package's data; and what a browser that
opens the router's root (`/`) is sent to: the dashboard."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib.resources import files

from aiohttp import web

_TYPES = {"html": "text/html", "css": "text/css", "js": "text/javascript"}


def _read(name: str) -> bytes:
    return files("corral.router.dashboard").joinpath("static", *name.split("/")).read_bytes()


DASHBOARD_PATH = "/dashboard"


def wants_page(request: web.Request) -> bool:
    """Whether a GET is a browser's, which asks for HTML by name (`Accept: text/html,...`); curl's
    `*/*` and API clients' `application/json` are not, and keep the router's JSON answers."""
    accept = request.headers.get("Accept", "")
    return any(part.split(";", 1)[0].strip().lower() == "text/html" for part in accept.split(","))


def to_dashboard() -> web.Response:
    """The root's answer to a browser: a redirect to the dashboard on the same listener (a relative
    Location: the browser keeps the host and port it used, so it names nothing the page does not)."""
    return web.Response(status=302, headers={"Location": DASHBOARD_PATH, "Cache-Control": "no-store"})


def page_handler() -> Callable[[web.Request], Awaitable[web.Response]]:
    """One handler serving the page with its CSS and JS inlined (one admin route, one request), the
    charting library too (`static/vendor/uplot`, see its PROVENANCE.md): nothing from another origin."""
    html = _read("dashboard.html").decode("utf-8")
    html = html.replace("/*CSS*/", _read("dashboard.css").decode("utf-8"))
    html = html.replace("/*JS*/", _read("dashboard.js").decode("utf-8"))
    html = html.replace("/*CHARTS_JS*/", _read("charts.js").decode("utf-8"))
    # last: nothing in the library's own text is taken for a marker
    html = html.replace("/*UPLOT_CSS*/", _read("vendor/uplot/uPlot.min.css").decode("utf-8"))
    html = html.replace("/*UPLOT_JS*/", _read("vendor/uplot/uPlot.iife.min.js").decode("utf-8"))
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
