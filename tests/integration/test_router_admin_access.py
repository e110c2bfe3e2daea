"""Who reads the router's admin routes (/metrics, /v1/fleet): loopback clients of a loopback-bound
router, anyone with the admin key, or the admin port only; /health stays open and names no URL.

A router bound beyond loopback is the router app built with that listen address in its config and
served on 127.0.0.1 (tests stay on loopback): the rule must not trust a loopback peer there, since
behind a sidecar or a port-forward every stranger arrives from 127.0.0.1."""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from yarl import URL

from corral.router.app import RouterConfig, build_app
from corral.router.edge.admin_access import AdminAccessConfig
from tests.support.procs import CorralProcess, free_port

ADMIN_KEY = "admin-key-0123456789abcdef"
TENANT_KEY = "tenant-key-0123456789abcd"
ADMIN_ROUTES = ("/metrics", "/v1/fleet")
NO_ENGINE = "http://127.0.0.1:9"  # nothing listens: endpoints and their URLs exist, none READY


async def serve(config: RouterConfig) -> AsyncIterator[str]:
    server = TestServer(build_app(config), host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


@pytest.fixture
async def beyond_loopback() -> AsyncIterator[str]:
    """A router configured as listening on 0.0.0.0, with an admin key."""
    admin = AdminAccessConfig(host="0.0.0.0", admin_key_sha256=hashlib.sha256(ADMIN_KEY.encode()).digest())
    async for url in serve(RouterConfig(backends=[NO_ENGINE], admin=admin)):
        yield url


async def get(url: str, key: str | None = None) -> tuple[int, dict[str, str], bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def test_admin_routes_are_open_to_loopback_on_a_loopback_router() -> None:
    async for url in serve(RouterConfig(backends=[NO_ENGINE])):
        for path in ADMIN_ROUTES:
            status, _, body = await get(url + path)
            assert status == 200, body
        assert NO_ENGINE.encode() in (await get(url + "/v1/fleet"))[2]


async def test_beyond_loopback_the_admin_routes_want_the_admin_key(beyond_loopback: str) -> None:
    for path in ADMIN_ROUTES:
        for key in (None, "wrong-key", TENANT_KEY):
            status, headers, body = await get(beyond_loopback + path, key)
            assert status == 401, (path, key, body)
            err: dict[str, Any] = orjson.loads(body)["error"]
            assert (err["type"], err["code"]) == ("authentication_error", 401)
            assert "admin" in err["message"]
            assert headers["WWW-Authenticate"].startswith("Bearer")
            assert b"127.0.0.1:9" not in body and (key is None or key.encode() not in body)
        status, _, body = await get(beyond_loopback + path, ADMIN_KEY)
        assert status == 200, body


async def test_an_encoded_or_odd_path_does_not_slip_past_the_check(beyond_loopback: str) -> None:
    for path in ("/v1/%66leet", "/%6detrics", "/v1/fleet?x=1", "/metrics#frag"):
        async with aiohttp.ClientSession() as s, s.get(URL(beyond_loopback + path, encoded=True)) as resp:
            assert resp.status in (401, 404), (path, resp.status)
            assert b"127.0.0.1:9" not in await resp.read()
    for method in ("HEAD", "POST", "OPTIONS"):
        async with aiohttp.ClientSession() as s, s.request(method, beyond_loopback + "/v1/fleet") as resp:
            assert resp.status == 401, method


async def test_beyond_loopback_without_an_admin_key_nobody_reads_them() -> None:
    async for url in serve(RouterConfig(backends=[NO_ENGINE], admin=AdminAccessConfig(host="0.0.0.0"))):
        status, _, body = await get(url + "/v1/fleet", "anything")
        assert status == 401
        assert "--admin-key-file" in orjson.loads(body)["error"]["message"]


async def test_health_is_open_and_names_no_internal_url(beyond_loopback: str) -> None:
    status, _, body = await get(beyond_loopback + "/health")
    assert status == 503  # open (not 401), and honest: no engine is READY
    health = orjson.loads(body)
    assert health == {"status": "unavailable", "ready": 0, "endpoints": 1}
    assert b"http" not in body and b"127.0.0.1" not in body
    # the liveness probe answers whatever the fleet's state (a kubelet probes from the node's IP)
    status, _, body = await get(beyond_loopback + "/livez")
    assert status == 200 and orjson.loads(body) == {"status": "alive"}


async def test_a_tenant_key_does_not_open_admin_routes(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"- name: team\n  key: {TENANT_KEY}\n")
    admin = AdminAccessConfig(host="10.0.0.1", admin_key_sha256=hashlib.sha256(ADMIN_KEY.encode()).digest())
    async for url in serve(RouterConfig(backends=[NO_ENGINE], admin=admin, api_keys_file=keys)):
        assert (await get(url + "/v1/fleet", TENANT_KEY))[0] == 401
        assert (await get(url + "/v1/fleet", ADMIN_KEY))[0] == 200
        # and the admin key is no tenant's
        assert (await get(url + "/v1/models", ADMIN_KEY))[0] == 401
        assert (await get(url + "/v1/models", TENANT_KEY))[0] == 200


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_with_an_admin_port_the_admin_routes_live_there_only() -> None:
    port, admin_port = free_port(), free_port()
    proc = CorralProcess(
        ["router", "--port", str(port), "--admin-port", str(admin_port), "--backend", NO_ENGINE]
    )
    main, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
    try:
        proc.wait_http(main + "/health", expect=503)
        for path in ADMIN_ROUTES:
            assert status_of(main + path) == 404
            assert status_of(admin + path) == 200
        assert status_of(admin + "/health") == 503
        assert status_of(admin + "/livez") == status_of(main + "/livez") == 200
        assert status_of(admin + "/v1/models") == 404
        assert status_of(main + "/v1/models") == 200
        # the printed line is the contract: it tells the person where to connect
        assert "admin routes /metrics, /v1/fleet and /dashboard: on http://127.0.0.1:" in proc.output()
    finally:
        proc.stop()


def test_the_admin_port_cannot_be_the_main_port() -> None:
    port = free_port()
    proc = CorralProcess(["router", "--port", str(port), "--admin-port", str(port), "--backend", NO_ENGINE])
    try:
        assert proc.wait_exit(30) == 2
        # the refusal is the contract: one line naming the value and what to do
        assert "--admin-port" in proc.output()
    finally:
        proc.stop()
