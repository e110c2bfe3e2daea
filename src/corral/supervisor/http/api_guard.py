"""Who may use the supervisor's management API (`/v1/...`): `ManagementGuard`, an aiohttp middleware.

In order: a request carrying an `Origin` other than the supervisor's own is refused (403; browsers name
the page's origin on every cross-origin request, command-line clients send none); a tokenless
supervisor, which only ever listens on loopback, refuses a `Host` that is not a loopback name (403: a
DNS-rebinding page); a supervisor with a token wants it as a bearer (401); and every mutating request
needs `Content-Type: application/json` (415), which a page cannot send to another origin without a CORS
preflight this API never grants. The probes (`/livez`, `/readyz`, `/startupz`, `/metrics`) stay open.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

from corral.http_host import foreign_origin, loopback_host
from corral.openai_errors import error_response

__all__ = ["ManagementGuard", "loopback_host"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MANAGEMENT_PREFIX = "/v1/"
JSON_TYPE = "application/json"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_SHOWN = 100  # characters of a refused header value shown back


def _shown(value: str) -> str:
    return repr(value if len(value) <= _SHOWN else value[:_SHOWN] + "...")


class ManagementGuard:
    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token is not None else None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(MANAGEMENT_PREFIX):
            return await handler(request)
        refusal = self.foreign(request) or self.unauthorized(request) or self.not_json(request)
        if refusal is not None:
            return refusal
        return await handler(request)

    @staticmethod
    def foreign(request: web.Request) -> web.Response | None:
        origin = request.headers.get("Origin")
        own = f"{request.scheme}://{request.host}"
        if not foreign_origin(origin, request.scheme, request.host):
            return None
        assert origin is not None
        return error_response(
            403,
            f"Origin {_shown(origin)} is not this supervisor's ({own}): the management API takes no "
            "requests from web pages; call it from the corral CLI or a server",
            "permission_error",
        )

    def unauthorized(self, request: web.Request) -> web.Response | None:
        if self._token is None:
            if loopback_host(request.host):
                return None
            return error_response(
                403,
                f"Host {_shown(request.host)} is not a loopback name, and this supervisor has no token; "
                "call it as 127.0.0.1 or localhost, or start it with --token-file",
                "permission_error",
            )
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), self._token):
            return None
        return error_response(401, "missing or wrong bearer token", "authentication_error")

    @staticmethod
    def not_json(request: web.Request) -> web.Response | None:
        if request.method in _SAFE_METHODS:
            return None
        if "Content-Type" not in request.headers:
            received = "no Content-Type"
        elif request.content_type != JSON_TYPE:
            received = f"Content-Type {_shown(request.headers['Content-Type'])}"
        else:
            return None
        return error_response(
            415,
            f"{request.method} {request.path} takes {JSON_TYPE!r}, not {received}; "
            f"send the body as JSON with 'Content-Type: {JSON_TYPE}'",
            "invalid_request_error",
        )
