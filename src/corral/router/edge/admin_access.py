"""Who may read the router's admin routes (`/metrics`, `/v1/fleet`, `/dashboard` and its feed, `/`,
which sends a browser to the dashboard, and any control route added later).

The rule, per listener: a request is trusted when it carries `Authorization: Bearer <admin key>`
(`--admin-key-file`), or when its peer is a loopback address, the listener it arrived on is bound to
a loopback address, *and* its `Host` is a loopback name (`localhost`, 127.x, `[::1]`, with a port or
not; corral.http_host): a page that re-points its own name at 127.0.0.1 (DNS rebinding) still sends
that name, and is refused 403. A router bound to 0.0.0.0 or to a pod IP therefore asks for the key
even from 127.0.0.1: behind a sidecar or a port-forward every stranger looks local. Forwarded-for
headers are never believed. A browser's cross-origin request (an `Origin` other than the router's
own) is refused 403 on every admin route, with a key or without: the dashboard is a page on the
router's own origin, and no other page may read the fleet through a visitor's browser.

With `--admin-port`, the admin routes move to that listener (on `--admin-host`, 127.0.0.1 by
default) under the same rule, and the main port answers them 404; `/health` (READY engines or 503)
and `/livez` (200 while the router answers) are served on both, show counts only, never an internal
URL, and stay open to any probe.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass

from aiohttp import web

from corral.http_host import foreign_origin, loopback_host
from corral.openai_errors import error_response

# "/" sends a browser to /dashboard, so it is guarded as the dashboard is: a visitor refused the page
# is refused its address too, and with --admin-port both are on that port only
ADMIN_PATHS = frozenset(
    {"/", "/metrics", "/v1/fleet", "/dashboard", "/dashboard/events", "/dashboard/series"}
)
OPEN_PATHS = frozenset({"/health", "/livez"})  # probes: counts only, never a URL
_SHOWN = 100  # characters of a refused header value shown back


def is_loopback_host(host: str) -> bool:
    """Whether a listen address accepts loopback connections only ("localhost" counts)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that resolves elsewhere, or a wildcard: not loopback


def _peer_is_loopback(request: web.Request) -> bool:
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    if not peer:
        return False  # a Unix socket or a closed transport: not trusted by address
    try:
        address = ipaddress.ip_address(peer[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _local_port(request: web.Request) -> int | None:
    transport = request.transport
    sock = transport.get_extra_info("sockname") if transport is not None else None
    return int(sock[1]) if sock and len(sock) >= 2 else None


def _shown(value: str) -> str:
    return repr(value if len(value) <= _SHOWN else value[:_SHOWN] + "...")


@dataclass(frozen=True, slots=True)
class AdminAccessConfig:
    host: str = "127.0.0.1"  # where the main listener is bound
    admin_port: int | None = None  # --admin-port: admin routes there only
    admin_host: str = "127.0.0.1"  # --admin-host
    admin_key_sha256: bytes | None = None  # --admin-key-file, as its digest

    def __repr__(self) -> str:
        key = "set" if self.admin_key_sha256 else "none"
        return f"AdminAccessConfig(host={self.host!r}, admin_port={self.admin_port}, key={key})"


class AdminAccess:
    """Answers whether one request may reach an admin route, and refuses it in OpenAI's error shape."""

    def __init__(self, config: AdminAccessConfig) -> None:
        self._config = config
        self._main_loopback = is_loopback_host(config.host)
        self._admin_loopback = is_loopback_host(config.admin_host)
        self.denied = 0

    @property
    def config(self) -> AdminAccessConfig:
        return self._config

    def on_admin_port(self, request: web.Request) -> bool:
        port = self._config.admin_port
        return port is not None and _local_port(request) == port

    def refuse(self, request: web.Request) -> web.Response | None:
        """None when the request may go on to its route; else the answer that ends it here."""
        path = request.path
        if path in OPEN_PATHS:
            return None
        config = self._config
        if config.admin_port is not None:
            admin_listener = self.on_admin_port(request)
            if admin_listener and path not in ADMIN_PATHS:
                return error_response(
                    404,
                    f"The admin port serves only {', '.join(sorted(ADMIN_PATHS | OPEN_PATHS))}; "
                    f"send {request.method} {path} to the router's main port.",
                    "NotFoundError",
                )
            if not admin_listener:
                if path in ADMIN_PATHS:
                    return error_response(
                        404,
                        f"{path} is served on the router's admin port ({config.admin_port}), not here.",
                        "NotFoundError",
                    )
                return None
            bound_loopback = self._admin_loopback
        elif path in ADMIN_PATHS:
            bound_loopback = self._main_loopback
        else:
            return None
        origin = request.headers.get("Origin")
        if origin is not None and foreign_origin(origin, request.scheme, request.host):
            self.denied += 1
            return error_response(
                403,
                f"{path} is an admin route and takes no requests from other sites' pages (Origin "
                f"{_shown(origin)}); open the router's own /dashboard, or call it from a command line.",
                "permission_error",
            )
        if self._has_admin_key(request):
            return None
        if bound_loopback and _peer_is_loopback(request):
            host = request.headers.get("Host")
            if host is None or loopback_host(host):  # browsers always send Host
                return None
            self.denied += 1
            return error_response(
                403,
                f"{path} is an admin route and Host {_shown(host)} is not a loopback name: a loopback "
                "client is trusted only when it calls the router as 127.0.0.1, [::1] or localhost; "
                "do that, or send `Authorization: Bearer <admin key>` (--admin-key-file).",
                "permission_error",
            )
        self.denied += 1
        if config.admin_key_sha256 is None:
            how = (
                "this router has no --admin-key-file, so it is open only to loopback clients "
                "while it listens on a loopback address; give it --admin-key-file or "
                "--admin-port (on 127.0.0.1)"
            )
        else:
            how = "send `Authorization: Bearer <admin key>` (the key in the router's --admin-key-file)"
        return error_response(
            401,
            f"{path} is an admin route: {how}.",
            "authentication_error",
            headers={"WWW-Authenticate": 'Bearer realm="corral-router-admin"'},
        )

    def _has_admin_key(self, request: web.Request) -> bool:
        wanted = self._config.admin_key_sha256
        header = request.headers.get("Authorization")
        if wanted is None or not header or header[:7].lower() != "bearer ":
            return False
        digest = hashlib.sha256(header[7:].strip().encode("utf-8")).digest()
        return hmac.compare_digest(digest, wanted)
