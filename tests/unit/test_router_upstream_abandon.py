"""`UpstreamClient.abandon`: the requests out to an engine the router judged failed fail at once and their
connections close, whether they wait for the answer's head or for its next bytes; other engines' requests
and idle connections are untouched. Against raw TCP servers that go silent on purpose."""

from __future__ import annotations

import asyncio

import pytest

from corral.router.datapath.upstream import EngineAbandoned, UpstreamClient
from tests.unit.test_router_upstream import OK, raw_server, read_request

STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def test_a_request_waiting_for_its_head_fails_at_once_and_its_connection_closes() -> None:
    received, closed = asyncio.Event(), asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        received.set()
        await reader.read()  # b"" once the router closes its end
        closed.set()

    async with raw_server(silent) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=300)  # far past the test's bounds
        out = asyncio.create_task(client.request(url, "POST", "/v1/completions", [], b"{}"))
        await asyncio.wait_for(received.wait(), 30)  # the request is out there
        assert client.abandon(url, "probe timed out") == 1
        with pytest.raises(EngineAbandoned, match="probe timed out"):
            await asyncio.wait_for(out, 30)
        await asyncio.wait_for(closed.wait(), 30)
        assert client.abandon(url, "again") == 0  # nothing left out there
        client.close()


async def test_a_stream_waiting_for_its_next_bytes_fails_at_once() -> None:
    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + b"6\r\ndata: \r\n")
        await writer.drain()
        await reader.read()

    async with raw_server(stalls) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=300)
        resp = await client.request(url, "POST", "/v1/completions", [], b"{}")
        assert await resp.readany() == b"data: "
        reading = asyncio.create_task(resp.readany())
        await asyncio.sleep(0)
        assert client.abandon(url, "supervisor: FAILED") == 1
        with pytest.raises(EngineAbandoned):
            await asyncio.wait_for(reading, 30)
        resp.close()
        client.close()


async def test_only_the_judged_engines_requests_are_abandoned() -> None:
    release, received = asyncio.Event(), asyncio.Event()

    async def slow_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            received.set()
            await release.wait()
            writer.write(OK)
            await writer.drain()

    async with raw_server(slow_ok) as judged, raw_server(slow_ok) as healthy:
        client = UpstreamClient(connect_timeout=2, read_timeout=300)
        other = asyncio.create_task(client.request(healthy, "POST", "/v1/x", [], b"{}"))
        await asyncio.wait_for(received.wait(), 30)
        doomed = asyncio.create_task(client.request(judged, "POST", "/v1/x", [], b"{}"))
        received.clear()
        await asyncio.wait_for(received.wait(), 30)
        assert client.abandon(judged, "judged") == 1
        with pytest.raises(EngineAbandoned):
            await asyncio.wait_for(doomed, 30)
        release.set()
        resp = await asyncio.wait_for(other, 30)
        assert (resp.status, await resp.read()) == (200, b"{}")
        resp.close()
        assert client.abandon(healthy, "idle connections are not requests") == 0
        client.close()


async def test_an_abandoned_request_on_a_reused_connection_is_not_sent_again() -> None:
    requests, second = 0, asyncio.Event()

    async def answers_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while True:
            await read_request(reader)
            requests += 1
            if requests == 1:
                writer.write(OK)
                await writer.drain()
            else:
                second.set()  # the frozen engine: it read the request and says nothing

    async with raw_server(answers_once) as url:
        client = UpstreamClient(connect_timeout=2, read_timeout=300)
        resp = await client.request(url, "POST", "/v1/x", [], b"{}")
        assert await resp.read() == b"{}"
        resp.close()  # back to the pool: the next request reuses it
        out = asyncio.create_task(client.request(url, "POST", "/v1/x", [], b"{}"))
        await asyncio.wait_for(second.wait(), 30)
        assert client.abandon(url, "judged") == 1
        with pytest.raises(EngineAbandoned):
            await asyncio.wait_for(out, 30)
        assert requests == 2 and client.abandon(url, "judged") == 0  # not sent a third time
        client.close()
