"""`corral.clients.access` against the router's own app in process: the admin routes read with the key,
each refusal (no key, a wrong key, the admin port elsewhere, nothing listening) a message naming the
flag to pass; no key in any message or repr; the CLI flags refuse an unreadable or empty key file."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from corral.clients.access import FleetAccess, RouterAdmin, RouterAdminError
from corral.fleet.checks.probe import FleetTarget
from corral.fleet.checks.status_cli import status
from corral.router.app import RouterConfig, build_app
from corral.router.edge.admin_access import AdminAccessConfig
from tests.support.procs import free_port

ADMIN_KEY = "admin-key-for-unit-tests-7f3a"
ENGINE_KEY = "engine-key-for-unit-tests-9c1d"
NO_ENGINE = "http://127.0.0.1:9"


async def serve(admin: AdminAccessConfig) -> AsyncIterator[str]:
    server = TestServer(build_app(RouterConfig(backends=[NO_ENGINE], admin=admin)), host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


@pytest.fixture
async def wide() -> AsyncIterator[str]:
    """A router configured as bound to 0.0.0.0 with an admin key: even loopback needs the key."""
    digest = hashlib.sha256(ADMIN_KEY.encode()).digest()
    async for url in serve(AdminAccessConfig(host="0.0.0.0", admin_key_sha256=digest)):
        yield url


async def refusal(admin: RouterAdmin) -> RouterAdminError:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(RouterAdminError) as caught:
            await admin.endpoints(session)
    assert ADMIN_KEY not in str(caught.value)
    return caught.value


async def test_the_admin_key_reads_both_admin_routes(wide: str) -> None:
    admin = FleetAccess(router_admin_key=ADMIN_KEY).router_admin(wide)
    async with aiohttp.ClientSession() as session:
        assert [e["url"] for e in await admin.endpoints(session)] == [NO_ENGINE]
        assert "corral_router" in await admin.metrics(session)


async def test_each_refusal_names_what_to_pass(wide: str) -> None:
    missing = await refusal(RouterAdmin(wide))
    assert missing.status == 401 and missing.refused
    assert "--router-admin-key-file" in str(missing) and "CORRAL_ROUTER_ADMIN_KEY_FILE" in str(missing)

    wrong = await refusal(RouterAdmin(wide, key="not-the-key"))
    assert wrong.refused and "refused the key in --router-admin-key-file" in str(wrong)
    assert "not-the-key" not in str(wrong)

    nobody = await refusal(RouterAdmin(f"http://127.0.0.1:{free_port()}", key=ADMIN_KEY))
    assert nobody.status is None and not nobody.refused and "unreachable" in str(nobody)


async def test_a_router_with_an_admin_port_elsewhere_points_at_router_admin_url() -> None:
    elsewhere = free_port()
    async for url in serve(AdminAccessConfig(admin_port=elsewhere)):
        moved = await refusal(RouterAdmin(url))
        assert moved.status == 404 and moved.refused
        assert "--router-admin-url" in str(moved) and f"({elsewhere})" in str(moved)


def test_no_key_in_a_repr() -> None:
    access = FleetAccess("http://127.0.0.1:1", ADMIN_KEY, ENGINE_KEY)
    target = FleetTarget("http://127.0.0.1:2", [], "supervisor-token-0", access)
    for shown in (repr(access), repr(target), repr(access.router_admin("http://127.0.0.1:2"))):
        assert ADMIN_KEY not in shown and ENGINE_KEY not in shown and "supervisor-token-0" not in shown
    assert access.engine_headers() == {"Authorization": f"Bearer {ENGINE_KEY}"}
    assert FleetAccess().engine_headers() == {}


@pytest.mark.parametrize(
    ("flag", "content", "said"),
    [
        ("--router-admin-key-file", None, "unreadable"),
        ("--router-admin-key-file", "", "is empty"),
        ("--engine-api-key-file", "two words", "more than one word"),
    ],
)
def test_a_bad_key_file_is_a_usage_error_naming_the_flag(
    tmp_path: Path, flag: str, content: str | None, said: str
) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
    result = CliRunner().invoke(status, ["--router", "http://127.0.0.1:9", flag, str(path)])
    assert result.exit_code == 2, result.output
    assert flag in result.output and said in result.output, result.output
    assert "two words" not in result.output


def test_router_admin_url_must_be_a_url() -> None:
    result = CliRunner().invoke(
        status, ["--router", "http://127.0.0.1:9", "--router-admin-url", "127.0.0.1:9"]
    )
    assert result.exit_code == 2 and "--router-admin-url" in result.output, result.output
