"""`corral sim --api-key` / VLLM_API_KEY: the `/v1` routes need the bearer key, as vLLM's middleware
demands; health, metrics and the other operational routes stay open. In-process simulator, real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from corral.sim import cli as sim_cli
from corral.sim import server as sim_server
from corral.sim.core.config import SimConfig, effective_keys
from corral.sim.http.auth import ApiKeyGuard
from corral.sim.server import SimServer

KEY = "sk-sim-7f3a9c"
COMPLETION = {"model": "sim-model", "prompt": "hello", "max_tokens": 2}


def test_the_cli_key_wins_over_the_environment_and_empty_keys_guard_nothing() -> None:
    assert effective_keys(("a", "b"), "env") == ("a", "b")
    assert effective_keys((), "env") == ("env",)
    assert effective_keys((), "") == ()
    assert effective_keys((), None) == ()
    assert effective_keys(("",), "env") == ()  # as vLLM: an explicit empty --api-key means no guard


def test_the_guard_takes_only_a_bearer_with_a_known_key() -> None:
    guard = ApiKeyGuard(["k1", "k2"])
    assert guard.admits("Bearer k1") and guard.admits("bearer k2") and guard.admits("BEARER k1")
    for wrong in (None, "", "k1", "Basic k1", "Bearer k3", "Bearer  k1", "Bearer k1 "):
        assert not guard.admits(wrong), wrong
    with pytest.raises(ValueError, match="at least one key"):
        ApiKeyGuard([])


def test_the_key_never_shows_in_the_config_repr() -> None:
    assert KEY not in repr(SimConfig(api_key=(KEY,), env_api_key=KEY))


@pytest.fixture
async def guarded() -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    sim = SimServer(SimConfig(api_key=(KEY,), enable_lora=True))
    server = TestServer(sim.api.build(), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            yield session, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_v1_routes_answer_401_without_the_key_and_serve_with_it(
    guarded: tuple[aiohttp.ClientSession, str],
) -> None:
    session, url = guarded
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("GET", "/v1/nothing-here")):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            async with session.request(method, url + path, json=COMPLETION, headers=headers) as r:
                assert r.status == 401, (method, path, headers)
                assert await r.json() == {"error": "Unauthorized"}
                assert r.headers["x-request-id"]
    auth = {"Authorization": f"Bearer {KEY}"}
    async with session.get(url + "/v1/models", headers=auth) as r:
        assert r.status == 200 and (await r.json())["data"][0]["id"] == "sim-model"
    async with session.post(url + "/v1/completions", json=COMPLETION, headers=auth) as r:
        assert r.status == 200 and (await r.json())["object"] == "text_completion"
    async with session.get(url + "/v1/nothing-here", headers=auth) as r:
        assert r.status == 404


async def test_routes_outside_v1_and_options_stay_open(guarded: tuple[aiohttp.ClientSession, str]) -> None:
    session, url = guarded
    for path in ("/health", "/ping", "/version", "/load", "/metrics"):
        async with session.get(url + path) as r:
            assert r.status == 200, path
    async with session.post(url + "/tokenize", json={"prompt": "hi"}) as r:
        assert r.status == 200
    async with session.options(url + "/v1/models") as r:
        assert r.status != 401


def test_the_cli_reads_the_flag_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[SimConfig] = []

    class Capture:
        def __init__(self, config: SimConfig) -> None:
            seen.append(config)

        async def run(self) -> int:
            return 0

    monkeypatch.setattr(sim_server, "SimServer", Capture)  # the command imports it when it runs
    runner = CliRunner()
    assert (
        runner.invoke(sim_cli.sim, ["--api-key", "a", "--api-key", "b"], env={"VLLM_API_KEY": "e"}).exit_code
        == 0
    )
    assert runner.invoke(sim_cli.sim, [], env={"VLLM_API_KEY": "e"}).exit_code == 0
    assert runner.invoke(sim_cli.sim, [], env={"VLLM_API_KEY": ""}).exit_code == 0
    assert [c.api_keys for c in seen] == [("a", "b"), ("e",), ()]
