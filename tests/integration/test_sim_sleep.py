"""`corral sim` with VLLM_SERVER_DEV_MODE=1: sleep levels and modes, wake tags, KV release, weight reload,
pause/resume, abort, and the metrics (sleep state, simulated memory) that follow them. Real processes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.support.procs import CorralProcess, free_port

GIB = 2**30
DEV = {"VLLM_SERVER_DEV_MODE": "1"}
NOT_FOUND = {"detail": "Not Found"}


def start(env: dict[str, str], *extra: str) -> tuple[CorralProcess, str]:
    port = free_port()
    proc = CorralProcess(["sim", "--port", str(port), "--itl-ms", "20", *extra], env=env)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    return proc, url


@pytest.fixture
def dev_sim() -> Iterator[tuple[CorralProcess, str]]:
    proc, url = start(DEV, "--enable-sleep-mode", "--weights-gib", "2", "--kv-cache-gib", "4")
    try:
        yield proc, url
    finally:
        proc.stop()


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                return float(value)
    raise AssertionError(f"{name} {labels} not in metrics")


class Client:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.s, self.url = session, url

    async def post(self, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else (orjson.dumps(body) if body is not None else None)
        headers = {"content-type": "application/json"} if data is not None else {}
        async with self.s.post(self.url + path, data=data, headers=headers) as r:
            text = await r.read()
            return r.status, (orjson.loads(text) if text else None)

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.s.get(self.url + path) as r:
            text = await r.read()
            return r.status, (orjson.loads(text) if text else None)

    async def metrics(self) -> str:
        async with self.s.get(self.url + "/metrics") as r:
            return await r.text()

    async def sleep_state(self) -> dict[str, float]:
        text = await self.metrics()
        return {
            s: metric(text, "vllm:engine_sleep_state", sleep_state=s)
            for s in ("awake", "weights_offloaded", "discard_all")
        }

    async def memory(self) -> tuple[float, float, float]:
        text = await self.metrics()
        return (
            metric(text, "corral_sim_gpu_memory_bytes", kind="weights"),
            metric(text, "corral_sim_gpu_memory_bytes", kind="kv_cache"),
            metric(text, "corral_sim_cpu_backup_bytes"),
        )

    async def complete(self, max_tokens: int = 3, **extra: Any) -> dict[str, Any]:
        status, body = await self.post(
            "/v1/completions", {"prompt": "hello world", "max_tokens": max_tokens, **extra}
        )
        assert status == 200, body
        assert isinstance(body, dict)
        return body

    async def waiting(self) -> float:
        return metric(await self.metrics(), "vllm:num_requests_waiting")

    async def until(self, name: str, value: float) -> None:
        for _ in range(500):
            if metric(await self.metrics(), name) == value:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{name} never became {value}")


async def _stream_chunks(
    s: aiohttp.ClientSession, url: str, max_tokens: int, first: asyncio.Event, rid: str = "s1"
) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = []
    body = {"prompt": "tell me a story", "max_tokens": max_tokens, "stream": True}
    async with s.post(url + "/v1/completions", json=body, headers={"x-request-id": rid}) as r:
        assert r.status == 200
        async for line in r.content:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                chunks.append(orjson.loads(line[6:]))
                first.set()
            elif line.strip() == b"data: [DONE]":
                chunks.append({"done": True})
    return chunks


def _tokens(chunks: list[dict[str, Any]]) -> int:
    return sum(1 for c in chunks if c.get("choices") and c["choices"][0]["text"])


def _finish(chunks: list[dict[str, Any]]) -> str | None:
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    return reasons[-1] if reasons else None


# -- without dev mode -----------------------------------------------------------------------------------


async def test_dev_endpoints_are_404_without_dev_mode() -> None:
    proc, url = start({"VLLM_SERVER_DEV_MODE": "0"}, "--enable-sleep-mode")
    try:
        async with aiohttp.ClientSession() as s:
            c = Client(s, url)
            for path in ("/sleep", "/wake_up", "/release_kv_cache_memory", "/collective_rpc", "/pause"):
                assert await c.post(path) == (404, NOT_FOUND), path
            for path in ("/is_sleeping", "/is_paused", "/server_info"):
                assert await c.get(path) == (404, NOT_FOUND), path
            assert await c.post("/v1/load_lora_adapter", {}) == (404, NOT_FOUND)
    finally:
        proc.stop()


# -- levels -----------------------------------------------------------------------------------------------


async def test_level_1_cycle_offloads_weights_and_comes_back(dev_sim: tuple[CorralProcess, str]) -> None:
    async with aiohttp.ClientSession() as s:
        c = Client(s, dev_sim[1])
        assert await c.sleep_state() == {"awake": 1, "weights_offloaded": 0, "discard_all": 0}
        assert await c.memory() == (2 * GIB, 4 * GIB, 0)
        assert await c.post("/sleep?level=1") == (200, {"status": "sleeping", "level": 1})
        assert await c.get("/is_sleeping") == (200, {"is_sleeping": True})
        assert await c.sleep_state() == {"awake": 0, "weights_offloaded": 1, "discard_all": 0}
        assert await c.memory() == (0, 0, 2 * GIB)
        async with s.get(dev_sim[1] + "/health") as r:
            assert r.status == 200  # still "healthy" while asleep, as vLLM
        assert await c.post("/wake_up") == (200, {"status": "awake", "tags": None})
        assert await c.get("/is_sleeping") == (200, {"is_sleeping": False})
        assert await c.sleep_state() == {"awake": 1, "weights_offloaded": 0, "discard_all": 0}
        assert await c.memory() == (2 * GIB, 4 * GIB, 0)
        assert "unknown-weights" not in (await c.complete())["choices"][0]["text"]
    # the log line is the contract: vLLM writes it so, and the supervisor and operators read it
    assert "Sleep mode freed 6.00 GiB memory" in dev_sim[0].output()


async def test_level_2_in_runbook_order_serves_the_model_again(dev_sim: tuple[CorralProcess, str]) -> None:
    async with aiohttp.ClientSession() as s:
        c = Client(s, dev_sim[1])
        before = (await c.complete(temperature=0))["choices"][0]["text"]
        assert await c.post("/sleep?level=2") == (200, {"status": "sleeping", "level": 2})
        assert await c.sleep_state() == {"awake": 0, "weights_offloaded": 0, "discard_all": 1}
        assert await c.memory() == (0, 0, 0)
        assert await c.post("/wake_up?tags=weights") == (200, {"status": "sleeping", "tags": ["weights"]})
        assert await c.memory() == (2 * GIB, 0, 0)
        assert metric(await c.metrics(), "corral_sim_weights_valid") == 0
        assert await c.post("/collective_rpc", {"method": "reload_weights"}) == (200, {"results": [None]})
        assert metric(await c.metrics(), "corral_sim_weights_valid") == 1
        assert await c.post("/wake_up?tags=kv_cache") == (200, {"status": "awake", "tags": ["kv_cache"]})
        assert await c.memory() == (2 * GIB, 4 * GIB, 0)
        assert (await c.complete(temperature=0))["choices"][0]["text"] == before


async def test_level_2_wake_without_reload_serves_garbage_to_queued_requests(
    dev_sim: tuple[CorralProcess, str],
) -> None:
    proc, url = dev_sim
    async with aiohttp.ClientSession() as s:
        c = Client(s, url)
        await c.post("/sleep?level=2")
        assert (await c.post("/collective_rpc", {"method": "reload_weights"}))[0] == 500  # weights asleep
        await c.post("/wake_up?tags=weights")
        queued = asyncio.create_task(c.complete(4))
        await c.until("vllm:num_requests_waiting", 1)
        assert not queued.done()
        assert await c.post("/wake_up?tags=kv_cache") == (200, {"status": "awake", "tags": ["kv_cache"]})
        body = await queued
        assert body["choices"][0]["text"] == " <unknown-weights>" * 4
    # the log line is the contract: vLLM writes it so, and the supervisor and operators read it
    assert "holds no model" in proc.output()


async def test_partial_and_unknown_tag_wakes_leave_it_sleeping(dev_sim: tuple[CorralProcess, str]) -> None:
    proc, url = dev_sim
    async with aiohttp.ClientSession() as s:
        c = Client(s, url)
        await c.post("/sleep?level=1")
        assert await c.post("/wake_up?tags=kv_cache") == (200, {"status": "sleeping", "tags": ["kv_cache"]})
        assert await c.get("/is_sleeping") == (200, {"is_sleeping": True})
        assert await c.memory() == (0, 4 * GIB, 2 * GIB)
        status, body = await c.post("/wake_up?tags=weights&tags=bogus")
        assert (status, body) == (200, {"status": "sleeping", "tags": ["weights", "bogus"]})
        assert await c.memory() == (0, 4 * GIB, 2 * GIB)  # the unknown tag made the whole wake a no-op
        assert await c.post("/wake_up?tags=weights&tags=scheduling") == (
            200,
            {"status": "awake", "tags": ["weights", "scheduling"]},
        )
    # the log line is the contract: vLLM writes it so, and the supervisor and operators read it
    assert "Tag bogus is not in sleeping tags" in proc.output()


async def test_release_kv_only_after_a_completed_level_0_pause_and_only_once(
    dev_sim: tuple[CorralProcess, str],
) -> None:
    async with aiohttp.ClientSession() as s:
        c = Client(s, dev_sim[1])
        assert await c.post("/release_kv_cache_memory") == (
            500,
            {
                "error": {
                    "message": "Call to release_kv_cache_memory method failed: "
                    "release_kv_cache_memory() requires a completed pause first",
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            },
        )
        assert await c.post("/sleep?level=0&mode=keep") == (200, {"status": "sleeping", "level": 0})
        assert await c.sleep_state() == {"awake": 0, "weights_offloaded": 0, "discard_all": 0}
        assert await c.memory() == (2 * GIB, 4 * GIB, 0)
        assert await c.post("/release_kv_cache_memory") == (200, {"status": "kv_cache_released"})
        assert await c.memory() == (2 * GIB, 0, 0)
        status, body = await c.post("/release_kv_cache_memory")
        assert status == 500
        assert body["error"]["message"].endswith("requires all executor memory to be resident")
        partial = {"status": "sleeping", "tags": ["scheduling"]}
        assert await c.post("/wake_up?tags=scheduling") == (200, partial)
        assert await c.post("/wake_up?tags=kv_cache") == (200, {"status": "awake", "tags": ["kv_cache"]})
        assert await c.memory() == (2 * GIB, 4 * GIB, 0)


async def test_release_kv_after_level_1_is_refused(dev_sim: tuple[CorralProcess, str]) -> None:
    async with aiohttp.ClientSession() as s:
        c = Client(s, dev_sim[1])
        await c.post("/sleep?level=1")
        status, body = await c.post("/release_kv_cache_memory")
        assert status == 500 and "resident" in body["error"]["message"]
        await c.post("/wake_up")


# -- requests around a sleep --------------------------------------------------------------------------------


async def test_requests_arriving_while_asleep_are_queued_and_served_after_wake(
    dev_sim: tuple[CorralProcess, str],
) -> None:
    async with aiohttp.ClientSession() as s:
        c = Client(s, dev_sim[1])
        await c.post("/sleep?level=1")
        tasks = [asyncio.create_task(c.complete(3)) for _ in range(3)]
        await c.until("vllm:num_requests_waiting", 3)
        assert not any(t.done() for t in tasks)
        await c.post("/wake_up")
        bodies = await asyncio.gather(*tasks)
        assert all(b["choices"][0]["finish_reason"] == "length" for b in bodies)
        assert all(b["usage"]["completion_tokens"] == 3 for b in bodies)


async def test_abort_mode_aborts_the_in_flight_stream(dev_sim: tuple[CorralProcess, str]) -> None:
    async with aiohttp.ClientSession() as s:
        c = Client(s, dev_sim[1])
        first = asyncio.Event()
        stream = asyncio.create_task(_stream_chunks(s, dev_sim[1], 500, first))
        await first.wait()
        assert await c.post("/sleep?level=1&mode=abort") == (200, {"status": "sleeping", "level": 1})
        chunks = await stream
        assert chunks[-1] == {"done": True}
        assert _finish(chunks) == "abort" and _tokens(chunks) < 500
        assert metric(await c.metrics(), "vllm:request_success_total", finished_reason="abort") == 1
        await c.post("/wake_up")


async def test_wait_mode_lets_the_in_flight_request_finish(dev_sim: tuple[CorralProcess, str]) -> None:
    async with aiohttp.ClientSession() as s:
        c = Client(s, dev_sim[1])
        request = asyncio.create_task(c.complete(25))
        await c.until("vllm:num_requests_running", 1)
        assert await c.post("/sleep?level=1&mode=wait") == (200, {"status": "sleeping", "level": 1})
        assert metric(await c.metrics(), "vllm:num_requests_running") == 0
        body = await request
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 25
        await c.post("/wake_up")


async def test_keep_mode_freezes_the_stream_until_wake(dev_sim: tuple[CorralProcess, str]) -> None:
    async with aiohttp.ClientSession() as s:
        c = Client(s, dev_sim[1])
        first = asyncio.Event()
        stream = asyncio.create_task(_stream_chunks(s, dev_sim[1], 30, first))
        await first.wait()
        assert await c.post("/sleep?level=0&mode=keep") == (200, {"status": "sleeping", "level": 0})
        await asyncio.sleep(1.0)  # 30 tokens x 20 ms would have finished by now
        assert not stream.done()
        assert metric(await c.metrics(), "vllm:num_requests_running") == 1
        assert await c.post("/wake_up?tags=scheduling") == (200, {"status": "awake", "tags": ["scheduling"]})
        chunks = await stream
        assert _finish(chunks) == "length" and _tokens(chunks) == 30


async def test_abort_requests_by_id_ends_that_stream_only(dev_sim: tuple[CorralProcess, str]) -> None:
    async with aiohttp.ClientSession() as s:
        c = Client(s, dev_sim[1])
        first = asyncio.Event()
        stream = asyncio.create_task(_stream_chunks(s, dev_sim[1], 500, first, rid="victim"))
        await first.wait()
        assert await c.post("/abort_requests", {"request_ids": ["cmpl-victim"]}) == (
            200,
            {"status": "aborted", "aborted": 1},
        )
        chunks = await stream
        assert _finish(chunks) == "abort"
        assert (await c.complete(2))["choices"][0]["finish_reason"] == "length"


# -- pause ---------------------------------------------------------------------------------------------------


async def test_pause_turns_new_requests_away_with_a_retryable_503_until_resume(
    dev_sim: tuple[CorralProcess, str],
) -> None:
    async with aiohttp.ClientSession() as s:
        c = Client(s, dev_sim[1])
        assert await c.post("/pause") == (200, {"status": "paused"})
        assert await c.get("/is_paused") == (200, {"is_paused": True})
        assert await c.get("/is_sleeping") == (200, {"is_sleeping": True})
        status, body = await c.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert status == 503 and body["error"]["type"] == "ServiceUnavailableError"
        assert await c.post("/resume") == (200, {"status": "resumed"})
        assert await c.get("/is_paused") == (200, {"is_paused": False})
        assert (await c.complete(2))["usage"]["completion_tokens"] == 2


# -- bad input and the rest ------------------------------------------------------------------------------


async def test_bad_parameters_and_rpc_bodies_get_vllms_errors(dev_sim: tuple[CorralProcess, str]) -> None:
    async with aiohttp.ClientSession() as s:
        c = Client(s, dev_sim[1])
        status, body = await c.post("/sleep?level=3")
        assert status == 400 and body["error"]["type"] == "Bad Request"
        assert body["error"]["param"] == "query.level"
        assert "Input should be less than or equal to 2" in body["error"]["message"]
        status, body = await c.post("/sleep?mode=later")
        assert status == 400 and body["error"]["param"] == "query.mode"
        assert await c.get("/is_sleeping") == (200, {"is_sleeping": False})
        assert await c.post("/collective_rpc", {}) == (
            400,
            {
                "error": {
                    "message": "Missing 'method' in request body",
                    "type": "Bad Request",
                    "param": None,
                    "code": 400,
                }
            },
        )
        status, body = await c.post("/collective_rpc", raw=b"{nope")
        assert status == 400 and body["error"]["message"].startswith("JSON decode error")
        status, body = await c.post("/collective_rpc", {"method": "frobnicate"})
        assert status == 500
        assert body["error"]["message"] == (
            "Call to collective_rpc method failed: Worker failed with error "
            "''Worker' object has no attribute 'frobnicate'', please check the stack trace above for the "
            "root cause"
        )
        status, body = await c.post("/abort_requests", raw=b"[")
        assert (status, body["error"]["message"]) == (400, "Invalid JSON format")
        assert await c.post("/abort_requests", {}) == (200, {"status": "aborted", "aborted": 0})
        assert await c.post("/reset_prefix_cache") == (200, {"success": True})
        status, info = await c.get("/server_info")
        assert status == 200 and info["corral_sim"]["sleep_mode_enabled"] is True
        assert info["corral_sim"]["weight_load"]["source"] == "disk"


async def test_without_enable_sleep_mode_sleep_succeeds_but_frees_nothing() -> None:
    proc, url = start(DEV, "--weights-gib", "2", "--kv-cache-gib", "4")
    try:
        async with aiohttp.ClientSession() as s:
            c = Client(s, url)
            assert await c.post("/sleep?level=1") == (200, {"status": "sleeping", "level": 1})
            assert await c.get("/is_sleeping") == (200, {"is_sleeping": True})
            assert await c.sleep_state() == {"awake": 0, "weights_offloaded": 1, "discard_all": 0}
            assert await c.memory() == (2 * GIB, 4 * GIB, 0)  # what a supervisor's VERIFY must catch
            await c.post("/wake_up")
        # the log line is the contract: vLLM writes it so, and the supervisor and operators read it
        assert "Sleep mode freed 0.00 GiB memory" in proc.output()
    finally:
        proc.stop()
