"""Dependency gates against real sockets, files and HTTP servers on loopback."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from corral.gate_spec import GateSpecError
from corral.supervisor.checks.dependencies import GatesTimedOut, GateWaiter, parse_gate
from tests.support.waits import eventually


@pytest.mark.parametrize(
    ("spec", "kind", "target", "port"),
    [
        ("unix:/var/run/vineyard.sock", "unix", "/var/run/vineyard.sock", 0),
        ("tcp:kvcache-rpc:9600", "tcp", "kvcache-rpc", 9600),
        ("tcp:[::1]:9600", "tcp", "::1", 9600),
        ("http://127.0.0.1:8100/health", "http", "http://127.0.0.1:8100/health", 0),
        ("https://example.invalid/ready", "http", "https://example.invalid/ready", 0),
        ("file:/models/ready", "file", "/models/ready", 0),
    ],
)
def test_parse(spec: str, kind: str, target: str, port: int) -> None:
    gate = parse_gate(spec)
    assert (gate.kind, gate.target, gate.port) == (kind, target, port)


@pytest.mark.parametrize(
    "spec", ["redis://x:1", "/plain/path", "tcp:nohost", "tcp:h:99999", "unix:", "ftp:x"]
)
def test_bad_specs_name_the_value(spec: str) -> None:
    with pytest.raises(GateSpecError) as info:
        parse_gate(spec)
    assert repr(spec) in str(info.value) and "\n" not in str(info.value)


async def test_unix_gate_opens_when_the_socket_listens_not_when_the_file_exists(tmp_path: Path) -> None:
    path = tmp_path / "kv.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # a socket file nobody listens on: connect is refused
    log: list[str] = []
    waiter = GateWaiter([parse_gate(f"unix:{path}")], 0.4, log.append, initial_backoff=0.05)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(GatesTimedOut, match="unix:") as info:
            await waiter.wait(session)
        assert "refused" in str(info.value).lower()
        status = waiter.to_json()[0]
        assert status["open"] is False and status["attempts"] >= 2 and status["last_error"]
        stale.close()
        path.unlink()

        async def appear_later() -> asyncio.AbstractServer:
            await asyncio.sleep(0.3)
            return await asyncio.start_unix_server(lambda r, w: w.close(), str(path))

        waiter = GateWaiter([parse_gate(f"unix:{path}")], 10, log.append, initial_backoff=0.05)
        server_task = asyncio.create_task(appear_later())
        await waiter.wait(session)
        server = await server_task
        server.close()
    assert waiter.status[f"unix:{path}"].open
    # the log line is the contract: the operator sees the gate open (the status above is the API)
    assert any("is up after" in line for line in log)


async def test_tcp_file_and_http_gates(tmp_path: Path) -> None:
    app = web.Application()
    codes = iter([503, 503, 200])

    async def ready(request: web.Request) -> web.Response:
        return web.Response(status=next(codes, 200))

    app.router.add_get("/ready", ready)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    marker = tmp_path / "weights.done"
    gates = [
        parse_gate(f"tcp:127.0.0.1:{port}"),
        parse_gate(f"http://127.0.0.1:{port}/ready"),
        parse_gate(f"file:{marker}"),
    ]
    waiter = GateWaiter(gates, 10, lambda m: None, initial_backoff=0.05)
    try:
        async with aiohttp.ClientSession() as session:
            task = asyncio.create_task(waiter.wait(session))
            await eventually(
                lambda: waiter.status[f"file:{marker}"].last_error == f"{marker} does not exist",
                "the file gate tried and found no file",
            )
            marker.write_text("")
            await asyncio.wait_for(task, 10)
    finally:
        await runner.cleanup()
    assert all(s["open"] for s in waiter.to_json())
    assert waiter.status[f"http://127.0.0.1:{port}/ready"].attempts >= 3


async def test_progress_lines_show_elapsed_and_deadline(tmp_path: Path) -> None:
    log: list[str] = []
    waiter = GateWaiter([parse_gate(f"file:{tmp_path}/never")], 0.5, log.append, progress_every=0.1)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(GatesTimedOut):
            await waiter.wait(session)
    # the log line is the contract: the operator sees the time waited against the deadline
    assert any(("waiting for file:" in line and "s/0s" in line) or "/1s" in line for line in log), log
