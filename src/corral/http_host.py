"""What a request's `Host` and `Origin` headers say about who sent it, for the servers that trust a
loopback caller without a token (the tokenless supervisor's management API, the router's admin routes).

A page on another site that a browser loads can reach a loopback server through DNS rebinding (its own name
re-pointed at 127.0.0.1), but its requests still carry that name as `Host`; and a browser names the page's
origin in `Origin` on every cross-origin request. Only a loopback name (`localhost`, 127.0.0.0/8, `[::1]`,
with a port or not) is this machine's; command-line clients send no `Origin`.
"""

from __future__ import annotations

import ipaddress


def loopback_host(host: str) -> bool:
    """Whether a Host header names this machine (`localhost`, 127.0.0.0/8, `[::1]`), with a port or not."""
    if host.startswith("["):
        name = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        name = host.partition(":")[0]
    else:
        name = host  # a bare name, or a bare IPv6 address
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def foreign_origin(origin: str | None, scheme: str, host: str) -> bool:
    """Whether an `Origin` header names another site than `scheme://host` (None: not a browser's
    cross-origin request, never foreign)."""
    return origin is not None and origin != f"{scheme}://{host}"
