"""`corral router --api-keys-file` in front of a real `corral sim` that enforces its own `--api-key`:
who gets in (401 otherwise), the per-tenant limits (429 with Retry-After), the model list (404 as if
unknown), the file re-read on change, the per-tenant metrics, and that the client's key never
reaches an engine (the engine's own key does, from --engine-api-key-file)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.support.fake_kube import FakeKube
from tests.support.procs import CorralProcess, free_port, start_sim
from tests.support.prom import sample, scrape

ENGINE_KEY = "engine-key-0123456789abcdef"
KEY_A = "tenant-a-key-0123456789"
KEY_LIMITED = "tenant-limited-key-0123"
KEY_RATE = "tenant-rate-key-0123456"
KEY_OTHER_MODEL = "tenant-other-model-0123"
KEY_NEW = "tenant-new-key-9876543210"
SIM_ARGS = ("--seed", "0", "--ttft-base-ms", "5", "--itl-ms", "2", "--max-model-len", "256")
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

KEYS_FILE = f"""
- name: team-a
  key: {KEY_A}
- name: limited
  key_sha256: {hashlib.sha256(KEY_LIMITED.encode()).hexdigest()}
  max_in_flight: 1
- name: rate
  key: {KEY_RATE}
  requests_per_minute: 2
- name: other-model
  key: {KEY_OTHER_MODEL}
  models: [some-other-model]
"""


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def start_router(*args: str) -> tuple[CorralProcess, str]:
    port = free_port()
    proc = CorralProcess(
        ["router", "--host", "127.0.0.1", "--port", str(port), "--models-refresh-seconds", "0.5", *args]
    )
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")  # 200 only once an engine is READY: the probe got in
    return proc, url


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path, CorralProcess]]:
    """A sim enforcing ENGINE_KEY and a router with tenants and that engine key: (sim, router, keys
    file, router process)."""
    tmp = tmp_path_factory.mktemp("tenants")
    keys, engine_key = tmp / "keys.yaml", tmp / "engine.key"
    write_atomically(keys, KEYS_FILE)
    engine_key.write_text(ENGINE_KEY + "\n")
    sim, sim_url = start_sim(None, *SIM_ARGS, "--itl-ms", "20", "--api-key", ENGINE_KEY)
    try:
        router, router_url = start_router(
            "--backend", sim_url, "--api-keys-file", str(keys), "--engine-api-key-file", str(engine_key)
        )
    except BaseException:
        sim.stop()
        raise
    try:
        yield sim_url, router_url, keys, router
    finally:
        router.stop()
        sim.stop()


async def call(
    url: str, key: str | None, body: dict[str, Any] | None = None, path: str = "/v1/chat/completions"
) -> tuple[int, dict[str, str], dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with aiohttp.ClientSession() as s:
        if body is None:
            async with s.get(url + path, headers=headers) as resp:
                return resp.status, dict(resp.headers), orjson.loads(await resp.read())
        async with s.post(url + path, data=orjson.dumps(body), headers=headers) as resp:
            return resp.status, dict(resp.headers), orjson.loads(await resp.read())


async def test_no_key_or_a_wrong_key_gets_401_in_openai_shape(
    fleet: tuple[str, str, Path, CorralProcess],
) -> None:
    _, router, _, _ = fleet
    for key, start in ((None, "You didn't provide an API key"), ("not-a-key-at-all", "Incorrect API key")):
        status, headers, body = await call(router, key, CHAT)
        assert status == 401, body
        err = body["error"]
        assert (err["type"], err["code"]) == ("authentication_error", 401)
        assert err["message"].startswith(start)
        assert "not-a-key-at-all" not in err["message"]
        assert headers["WWW-Authenticate"].startswith("Bearer")
    # the engine's key is the engine's: it does not open the router
    status, _, _ = await call(router, ENGINE_KEY, CHAT)
    assert status == 401
    status, _, _ = await call(router, None, path="/v1/models")
    assert status == 401


async def test_a_tenant_is_served_by_an_engine_that_wants_its_own_key(
    fleet: tuple[str, str, Path, CorralProcess],
) -> None:
    sim, router, _, _ = fleet
    # the sim refuses the tenant's key itself: a 200 through the router means the router sent the
    # engine's key instead of the client's
    status, _, _ = await call(sim, KEY_A, CHAT)
    assert status == 401
    status, _, body = await call(router, KEY_A, CHAT)
    assert status == 200, body
    assert body["choices"][0]["message"]["content"]
    status, _, body = await call(router, KEY_A, path="/v1/models")
    assert status == 200 and [c["id"] for c in body["data"]] == ["sim-model"]


async def test_over_max_in_flight_gets_429_with_retry_after(
    fleet: tuple[str, str, Path, CorralProcess],
) -> None:
    _, router, _, _ = fleet
    long_stream = {**CHAT, "max_tokens": 100, "stream": True}
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {KEY_LIMITED}"}
        async with s.post(
            router + "/v1/chat/completions", data=orjson.dumps(long_stream), headers=headers
        ) as first:
            assert first.status == 200
            assert await first.content.readline()  # the stream is open: one request in flight
            status, got, body = await call(router, KEY_LIMITED, CHAT)
            assert status == 429, body
            assert int(got["Retry-After"]) >= 1
            assert body["error"]["type"] == "rate_limit_error"
            assert "max_in_flight" in body["error"]["message"]
            # another tenant is not held back by this one's limit
            assert (await call(router, KEY_A, CHAT))[0] == 200
            await first.read()
    status, _, _ = await call(router, KEY_LIMITED, CHAT)
    assert status == 200


async def test_over_requests_per_minute_gets_429_with_retry_after(
    fleet: tuple[str, str, Path, CorralProcess],
) -> None:
    _, router, _, _ = fleet
    assert [(await call(router, KEY_RATE, CHAT))[0] for _ in range(2)] == [200, 200]
    status, headers, body = await call(router, KEY_RATE, CHAT)
    assert status == 429, body
    assert 1 <= int(headers["Retry-After"]) <= 30  # 2 a minute: one more in at most 30 s
    assert "requests_per_minute" in body["error"]["message"]


async def test_a_model_outside_the_tenants_list_is_404_as_if_unknown(
    fleet: tuple[str, str, Path, CorralProcess],
) -> None:
    _, router, _, _ = fleet
    hidden = await call(router, KEY_OTHER_MODEL, CHAT)
    unknown = await call(router, KEY_A, {**CHAT, "model": "no-such-model"})
    assert hidden[0] == unknown[0] == 404
    assert hidden[2] == orjson.loads(orjson.dumps(unknown[2]).replace(b"no-such-model", b"sim-model"))
    status, _, body = await call(router, KEY_OTHER_MODEL, path="/v1/models")
    assert status == 200 and body["data"] == []


async def test_metrics_count_per_tenant_and_never_show_a_key(
    fleet: tuple[str, str, Path, CorralProcess],
) -> None:
    _, router, _, _ = fleet
    before = sample(
        scrape(router + "/metrics"), "corral_router_tenant_requests_total", tenant="team-a", code="200"
    )
    assert (await call(router, KEY_A, CHAT))[0] == 200
    assert (await call(router, None, CHAT))[0] == 401
    text = scrape(router + "/metrics")
    assert (
        sample(text, "corral_router_tenant_requests_total", tenant="team-a", code="200") == (before or 0) + 1
    )
    assert (sample(text, "corral_router_auth_failures_total", reason="missing") or 0) >= 1
    assert sample(text, "corral_router_tenant_in_flight", tenant="team-a") == 0
    assert sample(text, "corral_router_tenants") == 4
    for secret in (
        KEY_A,
        KEY_LIMITED,
        KEY_RATE,
        ENGINE_KEY,
        hashlib.sha256(KEY_LIMITED.encode()).hexdigest(),
    ):
        assert secret not in text


async def test_the_keys_file_is_read_again_on_change_and_a_bad_edit_keeps_the_tenants(
    fleet: tuple[str, str, Path, CorralProcess],
) -> None:
    _, router, keys, proc = fleet
    try:
        write_atomically(keys, KEYS_FILE + f"- name: newcomer\n  key: {KEY_NEW}\n")
        await wait_for_status(router, KEY_NEW, 200)
        # a bad edit: the previous tenants stay, the error is logged (naming the entry, not the key)
        write_atomically(keys, KEYS_FILE + f"- name: broken\n  key: {KEY_NEW}x\n  max_in_flight: -1\n")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if (sample(scrape(router + "/metrics"), "corral_router_api_keys_file_errors_total") or 0) >= 1:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(proc.output())
        assert (await call(router, KEY_NEW, CHAT))[0] == 200
        # the log line is the contract: it names the bad entry and field for whoever edited the file,
        # never a key
        assert "entry 5 (name 'broken'): field `max_in_flight`" in proc.output()
        assert KEY_NEW not in proc.output()
        # a tenant removed from the file is out at once
        write_atomically(keys, KEYS_FILE.replace(f"- name: team-a\n  key: {KEY_A}\n", ""))
        await wait_for_status(router, KEY_A, 401)
    finally:
        write_atomically(keys, KEYS_FILE)
        await wait_for_status(router, KEY_A, 200)


async def wait_for_status(router: str, key: str, want: int, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    got = None
    while time.monotonic() < deadline:
        got = (await call(router, key, CHAT))[0]
        if got == want:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"still {got}, not {want}")


def test_a_bad_keys_file_stops_the_router_at_start_naming_entry_and_field(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        f"- name: ok\n  key: {KEY_A}\n- name: bad\n  key: {KEY_NEW}\n  requests_per_minute: lots\n"
    )
    proc = CorralProcess(
        [
            "router",
            "--port",
            str(free_port()),
            "--backend",
            "http://127.0.0.1:9",
            "--api-keys-file",
            str(keys),
        ]
    )
    try:
        assert proc.wait_exit(30) == 2
        out = proc.output()
        # the refusal is the contract: one line naming the value and what to do
        assert "entry 2 (name 'bad'): field `requests_per_minute` must be a positive integer" in out
        assert KEY_NEW not in out and KEY_A not in out
    finally:
        proc.stop()


class EchoEngine:
    """An engine that answers /v1/models and echoes back the Authorization header it was sent."""

    def __init__(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.echo)
        self.runner = web.AppRunner(app)
        self.probe_auth: list[str | None] = []

    async def models(self, request: web.Request) -> web.Response:
        self.probe_auth.append(request.headers.get("Authorization"))
        return web.json_response({"object": "list", "data": [{"id": "sim-model", "object": "model"}]})

    async def echo(self, request: web.Request) -> web.Response:
        return web.json_response({"authorization": request.headers.get("Authorization")})


@pytest.mark.parametrize("engine_key", [None, ENGINE_KEY])
async def test_the_clients_key_never_reaches_the_engine(tmp_path: Path, engine_key: str | None) -> None:
    engine = EchoEngine()
    await engine.runner.setup()
    port = free_port()
    await web.TCPSite(engine.runner, "127.0.0.1", port).start()
    keys = tmp_path / "keys.yaml"
    write_atomically(keys, KEYS_FILE)
    args = ["--backend", f"http://127.0.0.1:{port}", "--api-keys-file", str(keys)]
    if engine_key is not None:
        (tmp_path / "engine.key").write_text(engine_key)
        args += ["--engine-api-key-file", str(tmp_path / "engine.key")]
    router, url = await asyncio.to_thread(start_router, *args)
    try:
        status, _, body = await call(url, KEY_A, CHAT)
        assert status == 200
        expected = f"Bearer {engine_key}" if engine_key else None
        assert body["authorization"] == expected
        assert engine.probe_auth and set(engine.probe_auth) == {expected}
    finally:
        router.stop()
        await engine.runner.cleanup()


def test_without_a_keys_file_the_router_is_open_and_says_so_at_start() -> None:
    sim, sim_url = start_sim(None, *SIM_ARGS)
    try:
        router, url = start_router("--backend", sim_url)
        try:
            assert asyncio.run(call(url, None, CHAT))[0] == 200
            # the log line is the contract: the operator is told the router is open
            assert "no --api-keys-file" in router.output()
        finally:
            router.stop()
    finally:
        sim.stop()


@pytest.mark.parametrize("discovery", ["file", "k8s"])
async def test_every_discovery_probes_with_the_engine_key(tmp_path: Path, discovery: str) -> None:
    """A sim enforcing its key is READY behind the router only if the /v1/models probe sends it."""
    (tmp_path / "engine.key").write_text(ENGINE_KEY)
    sim, sim_url = await asyncio.to_thread(start_sim, None, *SIM_ARGS, "--api-key", ENGINE_KEY)
    kube = FakeKube()
    try:
        if discovery == "file":
            (tmp_path / "backends").write_text(sim_url + "\n")
            args = ["--backends-file", str(tmp_path / "backends")]
        else:
            await kube.start()
            sim_port = int(sim_url.rsplit(":", 1)[1])
            kube.create_pod("vllm-0", "127.0.0.1", "serving", {"app": "vllm"}, port=sim_port)
            kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
            args = ["--discovery", "k8s", "--namespace", "serving", "--selector", "app=vllm"]
            args += ["--kubeconfig", str(kubeconfig), "--engine-port", str(sim_port)]
        router, url = await asyncio.to_thread(
            start_router, *args, "--engine-api-key-file", str(tmp_path / "engine.key")
        )
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(url + "/v1/chat/completions", data=orjson.dumps(CHAT)) as resp:
                    assert resp.status == 200, await resp.text()
            # the log is the contract here: no secret ever reaches it
            assert ENGINE_KEY not in router.output()
        finally:
            router.stop()
    finally:
        await kube.stop()
        sim.stop()
