"""The simulator process's life: slow start, missing dependencies, SIGTERM drain/abort, hangs and crashes."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from tests.support.procs import CorralProcess, free_port, start_sim

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}


def wait_for(cond: Callable[[], bool], timeout: float, what: str, proc: CorralProcess) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} not seen within {timeout}s:\n{proc.output()}")


RUNNING_ONE = 'vllm:num_requests_running{engine="0",model_name="sim-model"} 1.0'


async def until_running_one(session: aiohttp.ClientSession, url: str) -> None:
    """Wait until the engine's own gauge shows the one request the test sent running."""
    text = ""
    for _ in range(200):
        async with session.get(url + "/metrics") as r:
            text = await r.text()
        if RUNNING_ONE in text:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the request never ran: {text[-2000:]}")


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_port_is_refused_until_loaded_then_serves() -> None:
    port = free_port()
    proc, url = start_sim(port, "--startup-seconds", "1.5", wait=False)
    try:
        wait_for(lambda: "Starting to load model" in proc.output(), 10, "model load", proc)
        # the log line is the contract: vLLM writes it so, and the supervisor and operators read it
        assert "Starting vLLM server" not in proc.output()
        assert refused(port)
        proc.wait_http(url + "/health", timeout=15)
        out = proc.output()
        phases = [
            "non-default args",
            "Starting to load model",
            "Loading weights took",
            "Model loading took",
            "Available KV cache memory",
            "KV cache size: 65,536 tokens",
            "Maximum concurrency for",
            "init engine (profile, create kv cache, warmup model) took",
            f"Starting vLLM server on http://127.0.0.1:{port}",
        ]
        positions = [out.index(p) for p in phases]
        assert positions == sorted(positions)
    finally:
        proc.stop()


def test_missing_requirement_fails_engine_init_with_exit_1(tmp_path: Path) -> None:
    missing = tmp_path / "vineyard.sock"
    proc, _ = start_sim(None, "--requires", f"unix:{missing}", wait=False)
    try:
        assert proc.wait_exit(timeout=15) == 1
        out = proc.output()
        # the log lines are the contract: vLLM writes them so, and the supervisor and operators read them
        assert "ERROR" in out and f"unix:{missing}" in out
        assert "Engine core initialization failed" in out
        assert "Starting vLLM server" not in out
    finally:
        proc.stop()


def test_present_requirements_let_it_serve(tmp_path: Path) -> None:
    path = tmp_path / "ready"
    path.write_text("ok")
    sock_path = tmp_path / "dep.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    listener.listen(4)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    try:
        proc, _ = start_sim(
            None,
            "--requires",
            f"unix:{sock_path}",
            "--requires",
            str(path),
            "--requires",
            f"tcp:127.0.0.1:{tcp.getsockname()[1]}",
        )
        proc.stop()
    finally:
        listener.close()
        tcp.close()


def test_sigterm_with_nothing_in_flight_exits_0() -> None:
    proc, _ = start_sim()
    try:
        proc.signal(signal.SIGTERM)
        assert proc.wait_exit(timeout=10) == 0
        # the log line is the contract: vLLM writes it so, and the supervisor and operators read it
        assert "[shutdown] API server: shutdown triggered" in proc.output()
    finally:
        proc.stop()


async def _first_chunk_then_rest(
    url: str, body: dict[str, object]
) -> tuple[aiohttp.ClientSession, aiohttp.ClientResponse]:
    session = aiohttp.ClientSession()
    resp = await session.post(url + "/v1/chat/completions", json=body)
    assert resp.status == 200
    await resp.content.readuntil(b"\n\n")
    return session, resp


async def test_sigterm_drain_lets_in_flight_streams_finish() -> None:
    port = free_port()
    proc, url = start_sim(port, "--shutdown-timeout", "20", "--itl-ms", "40")
    try:
        session, resp = await _first_chunk_then_rest(url, {**CHAT, "max_tokens": 25, "stream": True})
        async with session:
            proc.signal(signal.SIGTERM)
            await asyncio.to_thread(wait_for, lambda: "mode=wait" in proc.output(), 10, "drain", proc)
            assert refused(port)  # no new connections while draining
            rest = await resp.read()
            assert rest.endswith(b"data: [DONE]\n\n")
            assert b'"finish_reason":"length"' in rest
        assert await asyncio.to_thread(proc.wait_exit, 10) == 0
    finally:
        proc.stop()


async def test_sigterm_without_timeout_aborts_and_waits_for_connections_like_vllm() -> None:
    proc, url = start_sim(None, "--itl-ms", "50")
    try:
        async with aiohttp.ClientSession() as session:
            pending = asyncio.create_task(
                session.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 200})
            )
            await until_running_one(session, url)
            proc.signal(signal.SIGTERM)
            await asyncio.to_thread(
                wait_for,
                lambda: "Waiting for connections to close" in proc.output(),
                10,
                "waiting for connections",
                proc,
            )
            await asyncio.sleep(0.5)
            assert not pending.done(), "an aborted request must get no answer at all"
            assert proc.proc.poll() is None, "the process waits while the connection is open"
            pending.cancel()
        assert await asyncio.to_thread(proc.wait_exit, 10) == 0
    finally:
        proc.stop()


async def test_hang_after_accepts_requests_that_never_produce_tokens_while_health_is_200() -> None:
    proc, url = start_sim(None, "--hang-after", "1")
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 3}) as r:
                assert r.status == 200
            with pytest.raises(TimeoutError):
                async with session.post(
                    url + "/v1/chat/completions",
                    json={**CHAT, "max_tokens": 3},
                    timeout=aiohttp.ClientTimeout(total=1.0),
                ) as r:
                    await r.read()
            hung = asyncio.create_task(session.post(url + "/v1/completions", json={"prompt": "x"}))
            await until_running_one(session, url)  # the hung request counts as running ...
            async with session.get(url + "/health") as r:
                assert r.status == 200  # ... while health says 200
            hung.cancel()
    finally:
        proc.stop()


async def test_crash_after_kills_the_process_with_requests_in_flight() -> None:
    proc, url = start_sim(None, "--crash-after", "2", "--itl-ms", "100")
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) as r:
                assert r.status == 200
            in_flight = await session.post(
                url + "/v1/completions", json={"prompt": "x", "max_tokens": 100, "stream": True}
            )
            await in_flight.content.readuntil(b"\n\n")
            with pytest.raises(aiohttp.ClientError):
                async with session.post(url + "/v1/completions", json={"prompt": "x"}) as r:
                    await r.read()
            with pytest.raises(aiohttp.ClientError):
                await in_flight.read()
        assert await asyncio.to_thread(proc.wait_exit, 10) == 1
        # the log line is the contract: vLLM writes it so, and the supervisor and operators read it
        assert "EngineDeadError" in proc.output()
    finally:
        proc.stop()


def test_bad_requires_spec_is_a_usage_error() -> None:
    proc = CorralProcess(["sim", "--requires", "tcp:nohost"])
    try:
        assert proc.wait_exit(timeout=10) == 2
        # the refusal is the contract: one line naming the value and what to do
        assert "tcp:HOST:PORT" in proc.output()
    finally:
        proc.stop()


def test_sigterm_during_startup_exits_promptly() -> None:
    proc, _ = start_sim(None, "--startup-seconds", "30", wait=False)
    try:
        wait_for(lambda: "Starting to load model" in proc.output(), 10, "model load", proc)
        proc.signal(signal.SIGTERM)
        assert proc.wait_exit(timeout=5) == 0
    except subprocess.TimeoutExpired:
        raise AssertionError(proc.output()) from None
    finally:
        proc.stop()
