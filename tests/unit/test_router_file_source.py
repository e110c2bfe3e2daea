"""`--backends-file`: read again when it changes; endpoints added and removed to match, a bad edit
keeps the last good list, and every endpoint says where it came from."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from corral.router.app import RouterConfig, build_app
from corral.router.discovery.backends_file import Backends, BackendsFileError, parse_backends
from tests.unit.test_router_proxy import FakeEngine


def test_parse_backends_skips_comments_and_rejects_non_urls(tmp_path: Path) -> None:
    text = "# engines\nhttp://a:1/\n\n  https://b:2  # second\n"
    assert parse_backends(text, tmp_path / "f") == Backends(["http://a:1", "https://b:2"], {})
    with pytest.raises(BackendsFileError, match=r"f:2: 'a:1' is not an engine;"):
        parse_backends("http://x:1\na:1\n", tmp_path / "f")


def test_parse_backends_reads_supervised_engines(tmp_path: Path) -> None:
    text = "http://a:1=http://a:9101/\nhttp://b:2\n"
    assert parse_backends(text, tmp_path / "f") == Backends(
        ["http://a:1", "http://b:2"], {"http://a:1": "http://a:9101"}
    )
    for bad in ("http://a:1=a:9101", "http://a:1=", "=http://a:9101", "http://a:1 = http://b:2"):
        with pytest.raises(BackendsFileError, match=r"f:1: .* is not an engine;"):
            parse_backends(bad + "\n", tmp_path / "f")


def test_parse_backends_reads_engine_names(tmp_path: Path) -> None:
    text = "http://a:1=http://a:9101 group=g0/2 name=engine-0  # g0\nhttp://b:2 name=engine-1 role=decode\n"
    backends = parse_backends(text, tmp_path / "f")
    assert backends.names == {"http://a:1": "engine-0", "http://b:2": "engine-1"}
    assert backends.groups["http://a:1"].name == "g0" and backends.roles == {"http://b:2": "decode"}
    for bad in ("name=", "name=a/b", "name=x name=y", "name=-x"):
        with pytest.raises(BackendsFileError, match=r"f:1: .* is not a name marker; write one name=NAME"):
            parse_backends(f"http://a:1 {bad}\n", tmp_path / "f")


async def test_backends_file_is_reloaded_on_change(tmp_path: Path) -> None:
    engines = [FakeEngine(f"e{i}") for i in range(2)]
    for e in engines:
        await e.server.start_server()
    path = tmp_path / "backends"
    path.write_text(engines[0].url + "\n")
    config = RouterConfig(backends_file=path, models_refresh_seconds=0.1)
    router = TestServer(build_app(config), host="127.0.0.1")
    await router.start_server()
    url = f"http://127.0.0.1:{router.port}"

    def write(text: str) -> None:
        path.write_text(text)
        stamp = path.stat().st_mtime_ns + 10_000_000  # a distinct mtime even on coarse clocks
        os.utime(path, ns=(stamp, stamp))

    async with aiohttp.ClientSession() as client:

        async def fleet() -> dict[str, Any]:
            async with client.get(url + "/v1/fleet") as resp:
                body: dict[str, Any] = await resp.json()
                return body

        async def routable(want: set[str]) -> dict[str, Any]:
            for _ in range(200):
                body = await fleet()
                if {e["url"] for e in body["endpoints"] if e["routable"]} == want:
                    return body
                await asyncio.sleep(0.02)
            raise AssertionError(await fleet())

        try:
            body = await routable({engines[0].url})
            assert body["source"] == "file" and body["endpoints"][0]["source"] == "file"
            write(f"{engines[0].url}\n{engines[1].url} name=engine-1\n")
            body = await routable({engines[0].url, engines[1].url})
            assert {e["url"]: e["name"] for e in body["endpoints"]} == {
                engines[0].url: None,
                engines[1].url: "engine-1",
            }
            write(f"# e0 taken out\n{engines[1].url} name=engine-1\n")
            body = await routable({engines[1].url})
            assert [e["url"] for e in body["endpoints"]] == [engines[1].url]
            assert body["left_routing"][-1]["url"] == engines[0].url
            assert body["left_routing"][-1]["cause"] == "file_removed"
            write("not a url\n")  # a bad edit: the last good list stays
            await asyncio.sleep(1.2)
            await routable({engines[1].url})
        finally:
            await router.close()
            for e in engines:
                await e.server.close()
