"""The engine's API key on the supervisor side: found by vLLM's rule, masked wherever it is shown, and
sent to the engine's origin only (real HTTP to two in-process servers)."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from corral.engine.flags import engine_api_key
from corral.redaction import MASK, Redactor, redact_argv
from corral.supervisor.checks.engine_auth import EngineKey
from corral.supervisor.lifecycle.engine_process import engine_environment


def test_the_key_is_found_as_vllm_finds_it() -> None:
    assert engine_api_key(["vllm", "serve", "m", "--api-key", "k1"], {}) == "k1"
    assert engine_api_key(["vllm", "serve", "--api-key=k2"], {"VLLM_API_KEY": "env"}) == "k2"
    assert engine_api_key(["sim", "--api-key", "a", "--port", "1", "--api-key", "b"], {}) == "b"  # the last
    assert engine_api_key(["vllm", "serve", "m"], {"VLLM_API_KEY": "env"}) == "env"
    assert engine_api_key(["vllm", "serve", "m"], {"VLLM_API_KEY": ""}) is None
    assert engine_api_key(["vllm", "serve", "m"], {}) is None
    assert (
        engine_api_key(["vllm", "--api-key", ""], {"VLLM_API_KEY": "env"}) is None
    )  # given, empty: no guard


def test_every_shown_command_masks_the_key() -> None:
    argv = [
        "vllm",
        "serve",
        "m",
        "--api-key",
        "k1",
        "k2",
        "--port",
        "8000",
        "--api-key=k3",
        "--api-key",
        "-k4",
    ]
    shown = redact_argv(argv)
    masked = ["--api-key", MASK, MASK, "--port", "8000", f"--api-key={MASK}", "--api-key", MASK]
    assert shown == ["vllm", "serve", "m", *masked]
    assert not {"k1", "k2", "k3", "-k4"} & set(shown)
    assert redact_argv(["sim", "--port", "1"]) == ["sim", "--port", "1"]
    mask = Redactor(["sekrit", None, ""])
    line = "(APIServer pid=1) INFO [api_utils.py:286] non-default args: {'api_key': ['sekrit']}"
    assert "sekrit" not in mask(line) and MASK in mask(line)
    assert mask("nothing to hide") == "nothing to hide"


def test_the_engine_environment_drops_corral_secrets_and_keeps_the_rest() -> None:
    inherited = {
        "PATH": "/bin",
        "CORRAL_TOKEN": "t",
        "CORRAL_TOKEN_FILE": "/run/token",
        "CORRAL_ADMIN_KEY_FILE": "/run/admin",
        "CORRAL_IMAGE": "img:1",
        "VLLM_API_KEY": "engine-key",
    }
    env = engine_environment({"CORRAL_TOKEN": "again", "VLLM_SERVER_DEV_MODE": "1"}, inherited)
    assert env == {
        "PATH": "/bin",
        "CORRAL_IMAGE": "img:1",
        "VLLM_API_KEY": "engine-key",
        "VLLM_SERVER_DEV_MODE": "1",
    }


async def test_the_key_goes_to_the_engine_origin_and_nowhere_else() -> None:
    seen: dict[str, str | None] = {}

    async def record(request: web.Request) -> web.Response:
        seen[request.headers.get("X-Who", "")] = request.headers.get("Authorization")
        return web.Response(text="ok")

    apps = []
    for _ in range(2):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", record)
        apps.append(TestServer(app, host="127.0.0.1"))
    engine, other = apps
    for server in apps:
        await server.start_server()
    try:
        key = EngineKey(str(engine.make_url("")))
        async with aiohttp.ClientSession(middlewares=(key,)) as session:
            await (await session.get(engine.make_url("/v1/models"), headers={"X-Who": "before"})).read()
            key.key = "engine-key"
            for who, url in (("engine", engine.make_url("/sleep")), ("other", other.make_url("/health"))):
                async with session.post(url, headers={"X-Who": who}) as resp:
                    assert resp.status == 200
            own = {"X-Who": "own", "Authorization": "Bearer mine"}
            await (await session.get(engine.make_url("/v1/models"), headers=own)).read()
    finally:
        for server in apps:
            await server.close()
    assert seen == {"before": None, "engine": "Bearer engine-key", "other": None, "own": "Bearer mine"}
    assert "engine-key" not in repr(key)
