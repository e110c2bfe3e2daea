"""The client limits' pieces on their own: sizes as written on the command line, the metric families
(present at zero before anything happens), and the middleware's caps on an in-process server."""

from __future__ import annotations

import asyncio
import resource

import click
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest

from corral.router.edge.client_connections import make_room_for
from corral.router.edge.client_limit_flags import (
    MIB,
    ClientLimits,
    client_limit_options,
    format_size,
    parse_size,
)
from corral.router.edge.client_limits import (
    ClientLimitsCollector,
    ClientLimitStats,
    client_limits_middleware,
)
from tests.support.prom import sample


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("33554432", 32 * MIB),
        ("32MiB", 32 * MIB),
        ("32m", 32 * MIB),
        ("32 MB", 32 * MIB),
        ("512KiB", 512 * 1024),
        ("1GiB", 1024 * MIB),
        ("1.5MiB", 3 * MIB // 2),
        ("0", 0),
    ],
)
def test_sizes_as_written_on_the_command_line(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1", "32 TiB", "MiB"])
def test_a_size_that_is_not_one_says_how_to_write_it(text: str) -> None:
    with pytest.raises(ValueError, match="KiB, MiB or GiB"):
        parse_size(text)


def test_sizes_are_named_in_the_unit_they_divide() -> None:
    assert format_size(32 * MIB) == "32 MiB"
    assert format_size(512 * 1024) == "512 KiB"
    assert format_size(1000) == "1000 bytes"


def test_flags_become_one_client_limits() -> None:
    seen: list[ClientLimits] = []

    @click.command()
    @client_limit_options
    def command(client_limits: ClientLimits) -> None:
        seen.append(client_limits)

    runner = CliRunner()
    assert runner.invoke(command, []).exit_code == 0
    assert seen[-1] == ClientLimits()
    result = runner.invoke(
        command, ["--header-timeout", "3", "--max-in-flight", "7", "--max-body-size", "1KiB"]
    )
    assert result.exit_code == 0, result.output
    assert seen[-1] == ClientLimits(header_timeout=3, max_in_flight=7, max_body_bytes=1024)
    bad = runner.invoke(command, ["--max-body-size", "huge"])
    assert bad.exit_code == 2 and "--max-body-size" in bad.output and "'huge'" in bad.output


def test_every_family_is_on_metrics_at_zero_before_anything_happens() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClientLimitsCollector(ClientLimits(), ClientLimitStats()))
    text = generate_latest(registry).decode()
    assert sample(text, "corral_router_client_connections_open") == 0
    assert sample(text, "corral_router_client_requests_in_flight") == 0
    for reason in ("header_timeout", "body_timeout", "idle_timeout"):
        assert sample(text, "corral_router_client_connections_closed_total", reason=reason) == 0
    for reason in ("max_connections", "max_in_flight", "body_too_large"):
        assert sample(text, "corral_router_client_rejected_total", reason=reason) == 0
    assert sample(text, "corral_router_client_limit", limit="max_body_bytes") == 32 * MIB


class NoConnections:
    def request_started(self, request: web.BaseRequest) -> None:
        pass

    def request_finished(self, request: web.BaseRequest, started: object) -> None:
        pass


async def test_in_flight_cap_refuses_at_once_and_spares_the_exempt_paths() -> None:
    limits = ClientLimits(max_in_flight=1)
    stats = ClientLimitStats()
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        entered.set()
        await release.wait()
        return web.Response(text="done")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=[client_limits_middleware(limits, stats, NoConnections(), ["/health"])])
    app.router.add_post("/v1/slow", slow)
    app.router.add_get("/health", health)
    async with TestClient(TestServer(app)) as client:
        first = asyncio.create_task(client.post("/v1/slow", data=b"{}"))
        await entered.wait()
        refused = await client.post("/v1/slow", data=b"{}")
        assert refused.status == 503 and refused.headers["Retry-After"] == "1"
        assert orjson.loads(await refused.read())["error"]["type"] == "ServiceUnavailableError"
        assert (await client.get("/health")).status == 200
        assert stats.rejected["max_in_flight"] == 1 and stats.in_flight == 1
        release.set()
        assert (await first).status == 200
        assert stats.in_flight == 0


async def test_body_over_the_limit_is_413_in_openai_shape_declared_or_chunked() -> None:
    limits = ClientLimits(max_body_bytes=1024)
    stats = ClientLimitStats()

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    app = web.Application(
        client_max_size=limits.max_body_bytes,
        middlewares=[client_limits_middleware(limits, stats, NoConnections(), [])],
    )
    app.router.add_post("/v1/echo", echo)

    async def chunks() -> object:
        for _ in range(4):
            yield b"x" * 512

    async with TestClient(TestServer(app)) as client:
        assert (await client.post("/v1/echo", data=b"x" * 1024)).status == 200
        declared = await client.post("/v1/echo", data=b"x" * 1025)
        chunked = await client.post("/v1/echo", data=chunks())
        for answer in (declared, chunked):
            assert answer.status == 413
            error = orjson.loads(await answer.read())["error"]
            assert (
                error["code"] == 413 and "1 KiB" in error["message"] and "--max-body-size" in error["message"]
            )
        assert stats.rejected["body_too_large"] == 2


def test_a_connection_cap_beyond_the_open_file_limit_is_said_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard open-file limit to exceed")
    make_room_for(ClientLimits(max_connections=16, max_in_flight=16))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft  # enough already: untouched
    # the log line is the contract: it tells the operator to raise ulimit -n
    assert not caplog.records
    make_room_for(ClientLimits(max_connections=hard, max_in_flight=16))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard  # raised as far as allowed
    assert "--max-connections" in caplog.text and "ulimit -n" in caplog.text
