"""`corral router` in front of real `corral sim` processes on loopback: what the client sees through
the router is what the engine said (byte for byte for streams), and the router's own answers
(/v1/models, /v1/fleet, /health, /metrics, request errors) have the right shape."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.support.procs import CorralProcess, free_port, start_sim

SIM_ARGS = ("--seed", "0", "--ttft-base-ms", "5", "--itl-ms", "2", "--max-model-len", "256")


def start_router(
    *backends: str, extra: tuple[str, ...] = (), wait_ready: int | None = None
) -> tuple[CorralProcess, str]:
    port = free_port()
    args = ["router", "--host", "127.0.0.1", "--port", str(port), "--models-refresh-seconds", "0.5"]
    for b in backends:
        args += ["--backend", b]
    proc = CorralProcess([*args, *extra])
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/v1/fleet")
    if wait_ready is None:
        wait_ready = len(backends)
    wait_routable(proc, url, wait_ready)
    return proc, url


def fleet_state(url: str) -> list[dict[str, Any]]:
    import urllib.request

    with urllib.request.urlopen(url + "/v1/fleet", timeout=2.0) as resp:
        return list(orjson.loads(resp.read())["endpoints"])


def wait_routable(proc: CorralProcess, url: str, count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    state: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        state = fleet_state(url)
        if sum(e["routable"] for e in state) == count:
            return
        time.sleep(0.1)
    raise AssertionError(f"not {count} routable endpoints: {state}\n{proc.output()}")


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes | dict[str, Any],
    headers: dict[str, str] | None = None,
) -> tuple[int, aiohttp.typedefs.LooseHeaders, bytes]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with session.post(url, data=data, headers=headers) as resp:
        return resp.status, resp.headers.copy(), await resp.read()


CREATED = re.compile(rb'"created":\d+')


def normalise_created(body: bytes) -> bytes:
    """The only field allowed to differ between two runs of the same request: a wall-clock second."""
    return CREATED.sub(b'"created":0', body)


@pytest.fixture(scope="module")
def single() -> Iterator[tuple[str, str]]:
    """One sim and a router with it as its only backend: (sim url, router url)."""
    sim, sim_url = start_sim(None, *SIM_ARGS)
    router, router_url = start_router(sim_url)
    try:
        yield sim_url, router_url
    finally:
        router.stop()
        sim.stop()


CHAT = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "Tell me about corrals."}],
    "max_tokens": 12,
}
COMPLETION = {"model": "sim-model", "prompt": "Once upon a time", "max_tokens": 12}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}}),
        ("/v1/completions", {**COMPLETION, "stream": True}),
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", COMPLETION),
        ("/tokenize", {"model": "sim-model", "prompt": "hello there"}),
    ],
)
async def test_router_answer_is_byte_identical_to_the_engine(
    single: tuple[str, str], path: str, body: dict[str, Any]
) -> None:
    sim_url, router_url = single
    async with aiohttp.ClientSession() as s:
        direct = await post(s, sim_url + path, body, {"X-Request-Id": f"same-{path}"})
        routed = await post(s, router_url + path, body, {"X-Request-Id": f"same-{path}"})
    assert direct[0] == routed[0] == 200
    assert routed[1]["Content-Type"] == direct[1]["Content-Type"]
    assert routed[1]["X-Request-Id"] == f"same-{path}"
    assert normalise_created(routed[2]) == normalise_created(direct[2])
    if body.get("stream"):
        assert routed[2].endswith(b"data: [DONE]\n\n")


async def test_request_errors_through_the_router(single: tuple[str, str]) -> None:
    sim_url, router_url = single
    async with aiohttp.ClientSession() as s:
        status, headers, body = await post(s, router_url + "/v1/chat/completions", b'{"model": "sim-model", ')
        err = orjson.loads(body)["error"]
        assert status == 400 and err["type"] == "Bad Request" and err["code"] == 400
        assert headers["X-Request-Id"]

        status, _, body = await post(s, router_url + "/v1/chat/completions", {**CHAT, "model": "nope"})
        err = orjson.loads(body)["error"]
        assert status == 404
        assert (err["type"], err["param"], err["code"]) == ("NotFoundError", "model", 404)
        assert err["message"].startswith("The model `nope` does not exist.")

        # Too long for --max-model-len 256: the engine's own 400 comes through unchanged.
        long_prompt = {**COMPLETION, "prompt": "word " * 2000}
        direct = await post(s, sim_url + "/v1/completions", long_prompt)
        routed = await post(s, router_url + "/v1/completions", long_prompt)
        assert routed[0] == direct[0] == 400
        assert routed[2] == direct[2]
        err = orjson.loads(routed[2])["error"]
        assert err["type"] == "BadRequestError" and err["code"] == 400


async def test_router_own_endpoints(single: tuple[str, str]) -> None:
    sim_url, router_url = single
    async with aiohttp.ClientSession() as s:
        async with s.get(router_url + "/health") as resp:
            assert resp.status == 200
        async with s.get(router_url + "/metrics") as resp:
            text = await resp.text()
    for name in (
        "corral_router_requests_total",
        "corral_router_errors_total",
        "corral_router_retries_total",
        "corral_router_endpoint_in_flight",
        "corral_router_request_duration_seconds",
        "corral_router_ttft_seconds",
        "corral_router_ejections_total",
    ):
        assert f"# TYPE {name}" in text, name
    assert f'corral_router_endpoint_in_flight{{endpoint="{sim_url}"}}' in text


async def test_models_union_and_fleet_view() -> None:
    a, a_url = start_sim(None, *SIM_ARGS, model="model-a")
    b, b_url = start_sim(None, *SIM_ARGS, model="model-b")
    dead_url = f"http://127.0.0.1:{free_port()}"
    router, url = start_router(a_url, b_url, dead_url, wait_ready=2)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/v1/models") as resp:
                models = orjson.loads(await resp.read())
            assert models["object"] == "list"
            assert sorted(m["id"] for m in models["data"]) == ["model-a", "model-b"]
            assert all(m["object"] == "model" for m in models["data"])
            async with s.get(url + "/v1/fleet") as resp:
                fleet = {e["url"]: e for e in orjson.loads(await resp.read())["endpoints"]}
            assert fleet[a_url]["models"] == ["model-a"] and fleet[a_url]["state"] == "READY"
            assert fleet[b_url]["routable"] is True and fleet[b_url]["ejected_until"] is None
            assert fleet[dead_url]["state"] == "STARTING" and fleet[dead_url]["routable"] is False
            assert "waiting for /v1/models" in fleet[dead_url]["reason"]
            for e in fleet.values():
                assert set(e) >= {
                    "url",
                    "state",
                    "reason",
                    "since",
                    "models",
                    "in_flight",
                    "ejected_until",
                    "routable",
                }
            # Each model goes to the one engine that serves it.
            for model in ("model-a", "model-b"):
                status, _, body = await post(s, url + "/v1/completions", {**COMPLETION, "model": model})
                assert status == 200 and orjson.loads(body)["model"] == model
    finally:
        router.stop()
        a.stop()
        b.stop()


async def test_503_with_retry_after_when_no_endpoint_can_serve() -> None:
    sim, sim_url = start_sim(None, *SIM_ARGS)
    router, url = start_router(sim_url, extra=("--eject-seconds", "5", "--max-retries", "1"))
    try:
        sim.stop()
        async with aiohttp.ClientSession() as s:
            for _ in range(2):
                status, headers, body = await post(s, url + "/v1/completions", COMPLETION)
                assert status == 503
                assert int(headers["Retry-After"]) >= 1
                err = orjson.loads(body)["error"]
                assert err["code"] == 503 and err["type"] == "ServiceUnavailableError"
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                async with s.get(url + "/health") as resp:
                    if resp.status == 503:
                        break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("router /health still 200 with its only engine dead")
    finally:
        router.stop()
