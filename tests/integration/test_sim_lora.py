"""`corral sim` LoRA adapters: runtime load/unload (VLLM_ALLOW_RUNTIME_LORA_UPDATING), `--lora-modules`,
serving `model: <adapter>`, `/v1/models` cards and `vllm:lora_requests_info`. Real processes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.support.procs import CorralProcess, free_port

LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}


def start(env: dict[str, str], *extra: str) -> tuple[CorralProcess, str]:
    port = free_port()
    proc = CorralProcess(["sim", "--port", str(port), "--model", "base", *extra], env=env)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    return proc, url


@pytest.fixture
def adapters(tmp_path: Path) -> Path:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    return tmp_path


@pytest.fixture
def lora_sim() -> Iterator[tuple[CorralProcess, str]]:
    proc, url = start(LORA_ENV, "--enable-lora", "--max-loras", "2", "--itl-ms", "20")
    try:
        yield proc, url
    finally:
        proc.stop()


async def post(s: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, str]:
    async with s.post(url, json=body) as r:
        return r.status, await r.text()


async def models(s: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    async with s.get(url + "/v1/models") as r:
        data: list[dict[str, Any]] = (await r.json())["data"]
        return data


async def complete(s: aiohttp.ClientSession, url: str, model: str, max_tokens: int = 4) -> tuple[int, Any]:
    body = {"model": model, "prompt": "hello", "max_tokens": max_tokens, "temperature": 0}
    async with s.post(url + "/v1/completions", json=body) as r:
        return r.status, await r.json()


async def test_load_serve_list_unload(lora_sim: tuple[CorralProcess, str], adapters: Path) -> None:
    url = lora_sim[1]
    async with aiohttp.ClientSession() as s:
        path = str(adapters / "a")
        status, text = await post(s, url + "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": path})
        assert (status, text) == (200, "Success: LoRA adapter 'a' added successfully.")
        cards = await models(s, url)
        assert [c["id"] for c in cards] == ["base", "a"]
        assert (cards[1]["root"], cards[1]["parent"], cards[1]["max_model_len"]) == (path, "base", None)
        status, base_body = await complete(s, url, "base")
        status, body = await complete(s, url, "a")
        assert status == 200 and body["model"] == "a"
        assert body["choices"][0]["text"] != base_body["choices"][0]["text"]  # the adapter changes the output
        status, text = await post(s, url + "/v1/unload_lora_adapter", {"lora_name": "a"})
        assert (status, text) == (200, "Success: LoRA adapter 'a' removed successfully.")
        assert [c["id"] for c in await models(s, url)] == ["base"]
        status, body = await complete(s, url, "a")
        assert status == 404 and body["error"]["type"] == "NotFoundError"
        assert body["error"]["message"].startswith("The model `a` does not exist.")


async def test_load_and_unload_errors(lora_sim: tuple[CorralProcess, str], adapters: Path) -> None:
    url = lora_sim[1]
    load, unload = url + "/v1/load_lora_adapter", url + "/v1/unload_lora_adapter"
    async with aiohttp.ClientSession() as s:
        await post(s, load, {"lora_name": "a", "lora_path": str(adapters / "a")})
        status, text = await post(s, load, {"lora_name": "a", "lora_path": str(adapters / "a")})
        assert status == 400
        assert orjson.loads(text)["error"] == {
            "message": "The lora adapter 'a' has already been loaded. If you want to load the adapter in "
            "place, set 'load_inplace' to True.",
            "type": "InvalidUserInput",
            "param": None,
            "code": 400,
        }
        body = {"lora_name": "a", "lora_path": str(adapters / "b"), "load_inplace": True}
        assert (await post(s, load, body))[0] == 200
        status, text = await post(s, load, {"lora_name": "c", "lora_path": "/tmp/no/such/adapter"})
        assert status == 404
        assert orjson.loads(text)["error"]["message"] == "Loading lora c failed: No adapter found for <path>"
        status, text = await post(s, load, {"lora_path": str(adapters / "b")})
        assert status == 400 and orjson.loads(text)["error"]["param"] == "body.lora_name"
        status, text = await post(s, load, {"lora_name": "", "lora_path": ""})
        assert status == 400
        assert orjson.loads(text)["error"]["message"] == "Both 'lora_name' and 'lora_path' must be provided."
        status, text = await post(s, load, {"lora_name": "base", "lora_path": str(adapters / "b")})
        assert status == 400 and "conflicts with a served base model" in text
        async with s.post(load, data=b"lora_name=x", headers={"content-type": "text/plain"}) as r:
            assert r.status == 400 and "Unsupported Media Type" in await r.text()
        status, text = await post(s, unload, {"lora_name": "ghost"})
        assert (status, orjson.loads(text)["error"]["type"]) == (404, "NotFoundError")
        status, text = await post(s, unload, {"lora_name": ""})
        assert status == 400


async def test_lora_requests_info_names_the_running_adapter(
    lora_sim: tuple[CorralProcess, str], adapters: Path
) -> None:
    url = lora_sim[1]
    async with aiohttp.ClientSession() as s:
        await post(s, url + "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": str(adapters / "b")})
        request = asyncio.create_task(complete(s, url, "b", max_tokens=40))
        seen = ""
        for _ in range(200):
            async with s.get(url + "/metrics") as r:
                text = await r.text()
            lines = [ln for ln in text.splitlines() if ln.startswith("vllm:lora_requests_info{")]
            seen = "\n".join(lines)
            if 'running_lora_adapters="b"' in seen:
                break
            await asyncio.sleep(0.02)
        assert 'running_lora_adapters="b"' in seen and 'max_lora="2"' in seen
        assert (await request)[0] == 200


async def test_lora_modules_are_loaded_at_startup_without_runtime_updating(adapters: Path) -> None:
    proc, url = start({}, "--enable-lora", "--lora-modules", f"a={adapters / 'a'}")
    try:
        async with aiohttp.ClientSession() as s:
            assert [c["id"] for c in await models(s, url)] == ["base", "a"]
            assert (await complete(s, url, "a"))[0] == 200
            async with s.post(url + "/v1/load_lora_adapter", json={}) as r:
                assert r.status == 404  # runtime updating is off: the route does not exist
    finally:
        proc.stop()


def test_a_missing_lora_module_fails_startup(tmp_path: Path) -> None:
    proc = CorralProcess(
        ["sim", "--port", str(free_port()), "--enable-lora", "--lora-modules", f"x={tmp_path / 'missing'}"]
    )
    try:
        assert proc.wait_exit(timeout=15) == 1
        # the log line is the contract: vLLM writes it so, and the supervisor and operators read it
        assert "No adapter found for" in proc.output()
    finally:
        proc.stop()


async def test_runtime_updating_without_enable_lora_is_an_engine_error(adapters: Path) -> None:
    proc, url = start(LORA_ENV)
    try:
        async with aiohttp.ClientSession() as s:
            status, text = await post(
                s, url + "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(adapters / "a")}
            )
            assert status == 500 and "--enable-lora" in text
    finally:
        proc.stop()
