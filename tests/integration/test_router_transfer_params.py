"""`kv_transfer_params` belongs to the router alone (issue 27, finding 3), and what engines send the data
path is bounded (prefill answers, whole answers, SSE lines): a real router on each of its server sides in
front of a real `corral sim` configured as a NIXL `kv_both` engine, and of raw engines that answer as a
compromised one would (tests/support/hostile_engine.py)."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from multidict import CIMultiDict

from corral.engine import metric_names as names
from tests.integration.test_router_passthrough import SIM_ARGS, wait_routable
from tests.support import hostile_engine
from tests.support.procs import CorralProcess, free_port, start_sim
from tests.support.prom import sample, scrape

SERVERS = ("lean", "aiohttp")
MODEL = "sim-model"
PROMPT = "the tide comes in over the flats twice a day and the gulls follow it " * 2


@pytest.fixture
def procs() -> Iterator[list[CorralProcess]]:
    started: list[CorralProcess] = []
    try:
        yield started
    finally:
        for proc in reversed(started):
            proc.stop()


@pytest.fixture
def engines() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            hostile_engine.stop(proc)


def router(server: str, *args: str, routable: int = 1) -> tuple[CorralProcess, str]:
    port = free_port()
    proc = CorralProcess(
        [
            *("router", "--host", "127.0.0.1", "--port", str(port), "--models-refresh-seconds", "0.5"),
            *("--http-server", server, *args),
        ]
    )
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/v1/fleet")
    wait_routable(proc, url, routable)
    return proc, url


async def post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, CIMultiDict[str], bytes]:
    """Status, headers (case-insensitive, as HTTP's are: aiohttp spells some names its own way) and body."""
    async with session.post(url, data=orjson.dumps(body), headers=headers) as resp:
        return resp.status, CIMultiDict(resp.headers), await resp.read()


def hostile(engines: list[subprocess.Popen[bytes]], mode: str = "plain") -> str:
    proc, url = hostile_engine.start(mode)
    engines.append(proc)
    return url


def bodies(engine: str) -> list[Any]:
    import urllib.request

    with urllib.request.urlopen(engine + "/_bodies", timeout=5) as resp:
        return list(orjson.loads(resp.read()))


@pytest.mark.parametrize("server", SERVERS)
async def test_a_clients_params_never_steer_a_nixl_kv_both_engine(
    procs: list[CorralProcess], server: str
) -> None:
    """do_remote_decode pins no blocks and the answer names no engine id, host, port or block ids;
    do_remote_prefill with a host/port of the client's choosing makes the engine call nobody."""
    config = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    sim, engine = start_sim(None, *SIM_ARGS, "--kv-transfer-config", config, "--block-size", "16")
    procs.append(sim)
    proc, url = router(server, "--backend", engine)
    procs.append(proc)
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(8)
    trap.setblocking(False)
    trap_port = trap.getsockname()[1]
    pin = {"do_remote_decode": True, "do_remote_prefill": False}
    pull = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "elsewhere",
        "remote_request_id": "r-1",
        "remote_host": "127.0.0.1",
        "remote_port": trap_port,
        "remote_block_ids": [[0, 1, 2]],
    }
    try:
        async with aiohttp.ClientSession() as s:
            for path, shape in (
                ("/v1/completions", {"prompt": PROMPT}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]}),
            ):
                for params in (pin, pull):
                    for stream in (False, True):
                        body: dict[str, Any] = {"model": MODEL, **shape, "max_tokens": 3, "stream": stream}
                        body["kv_transfer_params"] = params
                        status, _, answer = await post(s, url + path, body)
                        assert status == 200, answer
                        for leaked in (b"remote_engine_id", b"remote_host", b"remote_block_ids"):
                            assert leaked not in answer, (path, params, answer)
        assert sample(scrape(engine + "/metrics"), names.SIM_KV_TRANSFERS_HELD) == 0  # nothing pinned
        with pytest.raises(BlockingIOError):
            trap.accept()  # the engine pulled from nobody (a connect would be in the backlog by now)
    finally:
        trap.close()


@pytest.mark.parametrize("server", SERVERS)
async def test_the_decode_leg_never_carries_the_clients_params(
    procs: list[CorralProcess], engines: list[subprocess.Popen[bytes]], server: str
) -> None:
    """A prefill engine that answers no params (a storage or unknown connector): the decode leg is the
    client's body less its kv_transfer_params; the prefill leg carries the router's own."""
    prefill, decode = hostile(engines), hostile(engines)
    proc, url = router(server, "--prefill", prefill, "--decode", decode, routable=2)
    procs.append(proc)
    params = {
        "do_remote_prefill": True,
        "remote_host": "127.0.0.1",
        "remote_port": 9,
        "remote_engine_id": "x",
    }
    async with aiohttp.ClientSession() as s:
        for stream in (False, True):
            body = {
                "model": hostile_engine.MODEL,
                "prompt": PROMPT,
                "stream": stream,
                "kv_transfer_params": params,
            }
            status, _, answer = await post(s, url + "/v1/completions", body)
            assert status == 200, answer
    legs = bodies(prefill)
    assert len(legs) == 2
    for leg in legs:
        assert leg["kv_transfer_params"]["do_remote_decode"] is True
        assert leg["kv_transfer_params"]["remote_host"] is None
    decoded = bodies(decode)
    assert len(decoded) == 2 and all("kv_transfer_params" not in leg for leg in decoded), decoded


@pytest.mark.parametrize("server", SERVERS)
async def test_params_in_an_engines_answer_do_not_reach_the_client(
    procs: list[CorralProcess], engines: list[subprocess.Popen[bytes]], server: str
) -> None:
    proc, url = router(server, "--backend", hostile(engines, "leaky"))
    procs.append(proc)
    async with aiohttp.ClientSession() as s:
        for stream in (False, True):
            body = {"model": hostile_engine.MODEL, "prompt": "x", "stream": stream}
            status, _, answer = await post(s, url + "/v1/completions", body)
            assert status == 200, answer
            assert hostile_engine.LEAKED_HOST.encode() not in answer
            assert hostile_engine.LEAKED_ENGINE.encode() not in answer
            if stream:
                assert answer.endswith(b"data: [DONE]\n\n") and b'"kv_transfer_params":null' in answer
            else:
                assert orjson.loads(answer)["kv_transfer_params"] is None


@pytest.mark.parametrize("mode", ["huge", "not-json"])
async def test_an_oversized_or_malformed_prefill_answer_fails_that_leg_only(
    procs: list[CorralProcess], engines: list[subprocess.Popen[bytes]], mode: str
) -> None:
    """Over 4 MiB, or not a JSON object: the leg fails like an engine's 5xx (a WARNING naming the engine,
    which is ejected); alone, the client gets a 502 naming no engine; beside a sound prefill engine,
    the request is served there."""
    headers = {"x-hostile": mode, "x-bytes": str(8 << 20)}
    body = {"model": hostile_engine.MODEL, "prompt": "x", "max_tokens": 2}
    bad, decode = hostile(engines), hostile(engines)
    proc, url = router("lean", "--prefill", bad, "--decode", decode, routable=2)
    procs.append(proc)
    async with aiohttp.ClientSession() as s:
        status, answer_headers, answer = await post(s, url + "/v1/completions", body, headers)
    assert status == 502, answer
    message = orjson.loads(answer)["error"]["message"]
    assert "127.0.0.1" not in message and "http" not in message
    assert answer_headers["X-Request-Id"] in message
    assert bodies(decode) == []
    # the log line is the contract: the client gets the request id, the operator finds the engine by it
    assert f"prefill {bad} answered" in proc.output()
    pd_bad = sample(
        scrape(url + "/metrics"), "corral_router_pd_failures_total", leg="prefill", why="bad_answer"
    )
    assert pd_bad == 1

    bad, good = hostile(engines, mode), hostile(engines)
    proc, url = router("lean", "--prefill", bad, "--prefill", good, "--decode", decode, routable=3)
    procs.append(proc)
    async with aiohttp.ClientSession() as s:
        for _ in range(6):
            status, _, answer = await post(s, url + "/v1/completions", body)
            assert status == 200, answer
    assert len(bodies(bad)) == 1 and len(bodies(good)) >= 5  # tried once, then ejected
    assert f"prefill {bad} answered" in proc.output()


@pytest.mark.parametrize("server", SERVERS)
async def test_a_whole_answer_over_the_bound_is_a_502_not_a_buffer(
    procs: list[CorralProcess], engines: list[subprocess.Popen[bytes]], server: str
) -> None:
    proc, url = router(server, "--backend", hostile(engines, "huge"))
    procs.append(proc)
    async with aiohttp.ClientSession() as s:
        status, headers, answer = await post(s, url + "/v1/completions", {"model": hostile_engine.MODEL})
    assert status == 502, answer[:200]
    message = orjson.loads(answer)["error"]["message"]
    assert "stream" in message and headers["X-Request-Id"] in message and "127.0.0.1" not in message
    # the log line is the contract: the client gets the request id, the operator finds the engine by it
    assert "over 67108864 bytes" in proc.output()


@pytest.mark.parametrize("server", SERVERS)
async def test_a_long_sse_line_is_relayed_and_params_at_its_end_end_the_stream(
    procs: list[CorralProcess], engines: list[subprocess.Popen[bytes]], server: str
) -> None:
    proc, url = router(server, "--backend", hostile(engines, "long-line"))
    procs.append(proc)
    body = {"model": hostile_engine.MODEL, "prompt": "x", "stream": True}
    async with aiohttp.ClientSession() as s:
        status, _, answer = await post(s, url + "/v1/completions", body)
        assert status == 200
        assert answer.count(b"x") >= 3 << 20 and answer.endswith(b"}\n\n")  # relayed whole, unchanged
        status, _, answer = await post(s, url + "/v1/completions", body, {"x-key": "1"})
    assert status == 200
    assert (
        hostile_engine.LEAKED_HOST.encode() not in answer
        and hostile_engine.LEAKED_ENGINE.encode() not in answer
    )
    assert b"BadGatewayError" in answer and b"127.0.0.1" not in answer.split(b"\n")[-3]
    # the log line is the contract: the client gets the request id, the operator finds the engine by it
    assert "carries kv_transfer_params" in proc.output()


@pytest.mark.parametrize("server", SERVERS)
async def test_a_dead_engine_is_not_named_to_the_client(procs: list[CorralProcess], server: str) -> None:
    """The 503 says what failed and the request id; the router's log has the engine and the error."""
    dead = f"http://127.0.0.1:{free_port()}"
    proc, url = router(server, "--backend", dead, routable=0)
    procs.append(proc)
    # routable=0: the probe never found it READY; with a backend that once answered, see the next test
    async with aiohttp.ClientSession() as s:
        status, headers, answer = await post(s, url + "/v1/completions", {"model": "m", "prompt": "x"})
    assert status == 503
    message = orjson.loads(answer)["error"]["message"]
    assert dead.split("//")[1] not in message and "127.0.0.1" not in message and "http" not in message
    assert headers["X-Request-Id"] in message


@pytest.mark.parametrize("server", SERVERS)
async def test_an_engine_dying_mid_request_is_not_named_to_the_client(
    procs: list[CorralProcess], engines: list[subprocess.Popen[bytes]], server: str
) -> None:
    engine = hostile(engines)
    proc, url = router(server, "--backend", engine, "--max-retries", "1")
    procs.append(proc)
    port = engine.rsplit(":", 1)[1]
    async with aiohttp.ClientSession() as s:
        # no answer at all (the connection closed): retried, then a 503 naming nothing internal
        status, headers, answer = await post(
            s, url + "/v1/completions", {"model": hostile_engine.MODEL, "prompt": "x"}, {"x-hostile": "close"}
        )
        assert status == 503, answer
        message = orjson.loads(answer)["error"]["message"]
        assert "127.0.0.1" not in message and port not in message and "Error" not in message
        assert headers["X-Request-Id"] in message and "tried, all failed" in message
        request_id = headers["X-Request-Id"]
    warnings = [
        line for line in proc.output().splitlines() if request_id in line and "no engine served" in line
    ]
    # the log line is the contract: the client gets the request id, the operator finds the engine by it
    assert len(warnings) == 1 and engine in warnings[0], proc.output()


@pytest.mark.parametrize("server", SERVERS)
async def test_a_stream_cut_mid_way_names_no_engine(
    procs: list[CorralProcess], engines: list[subprocess.Popen[bytes]], server: str
) -> None:
    engine = hostile(engines, "cut")
    proc, url = router(server, "--backend", engine)
    procs.append(proc)
    body = {"model": hostile_engine.MODEL, "prompt": "x", "stream": True}
    async with aiohttp.ClientSession() as s:
        status, headers, answer = await post(s, url + "/v1/completions", body)
    assert status == 200
    assert b"BadGatewayError" in answer and headers["X-Request-Id"].encode() in answer
    assert b"127.0.0.1" not in answer and b"Error:" not in answer
    # the log line is the contract: the client gets the request id, the operator finds the engine by it
    assert engine in proc.output()
