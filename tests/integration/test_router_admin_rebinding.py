"""DNS rebinding and foreign pages against the router's admin routes (issue 27, finding 8): a real router
process on each server side, bound to loopback with no admin key, trusts a loopback client only when it
calls the router by a loopback name; a page's cross-origin request is refused even with the key."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import CorralProcess, free_port

ADMIN_KEY = "admin-key-0123456789abcdef"
ADMIN_ROUTES = ("/v1/fleet", "/dashboard/events", "/metrics")
NO_ENGINE = "http://127.0.0.1:9"


@pytest.fixture(params=["lean", "aiohttp"])
def router(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[int]:
    key = tmp_path / "admin.key"
    key.write_text(ADMIN_KEY)
    port = free_port()
    args = ["router", "--host", "127.0.0.1", "--port", str(port), "--backend", NO_ENGINE]
    proc = CorralProcess([*args, "--http-server", request.param, "--admin-key-file", str(key)])
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health", expect=503)
        yield port
    finally:
        proc.stop()


def status(port: int, path: str, headers: dict[str, str]) -> int:
    """The status of a GET sent with exactly these headers (Host included); the body is not read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_rebound_name_is_refused_a_loopback_name_is_served(router: int) -> None:
    for path in ADMIN_ROUTES:
        for host in ("attacker.example", f"attacker.example:{router}", "10.0.0.1", "127.0.0.1.nip.io"):
            assert status(router, path, {"Host": host}) == 403, (path, host)
        for host in (
            f"127.0.0.1:{router}",
            "127.0.0.1",
            f"localhost:{router}",
            "LOCALHOST",
            f"[::1]:{router}",
        ):
            assert status(router, path, {"Host": host}) == 200, (path, host)
        # the admin key is trusted whatever the Host
        key = {"Authorization": f"Bearer {ADMIN_KEY}"}
        assert status(router, path, {"Host": "attacker.example", **key}) == 200, path


def test_a_foreign_origin_is_refused_even_with_the_key(router: int) -> None:
    own = f"127.0.0.1:{router}"
    key = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for path in ADMIN_ROUTES:
        assert status(router, path, {"Host": own, "Origin": "http://attacker.example"}) == 403, path
        assert status(router, path, {"Host": own, "Origin": "http://attacker.example", **key}) == 403, path
        assert status(router, path, {"Host": own, "Origin": f"http://{own}"}) == 200, path  # the dashboard
