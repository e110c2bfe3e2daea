"""Per-pod supervisor tokens: the derivation (one token per pod, none guessable from another), the
fleet key file's checks, `corral supervise derive-token`, the router's flags, and the router's state
streams, acknowledgements and wake calls each carrying the token of the endpoint they talk to
(against scripted supervisors on loopback that accept only their own pod's token)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from click.testing import CliRunner

from corral.cli import main
from corral.engine_state import EngineState
from corral.router.discovery.supervisor_stream import StreamSettings, SupervisorStreams
from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.membership.membership import Membership
from corral.router.telemetry.metrics import RouterMetrics
from tests.support.procs import free_port

KEY = bytes.fromhex("5f" * 32)


def tokens_module() -> Any:
    import corral.supervisor_tokens as module  # new with per-pod tokens

    return module


# -- derivation ---------------------------------------------------------------------------------------


def test_each_pod_gets_its_own_token() -> None:
    t = tokens_module()
    pods = [("ns", f"engine-{i}") for i in range(50)] + [("other", "engine-0"), ("ns-engine", "0")]
    tokens = {t.pod_token(KEY, ns, name) for ns, name in pods}
    assert len(tokens) == len(pods)
    assert t.pod_token(KEY, "ns", "engine-0") == t.pod_token(KEY, "ns", "engine-0")
    assert t.pod_token(KEY, "ns", "engine-0") != t.pod_token(bytes(32), "ns", "engine-0")


def test_the_token_is_hmac_sha256_of_the_pod_under_the_fleet_key() -> None:
    # the published recipe, so an operator can derive a pod's token without corral
    expected = hmac.new(KEY, b"corral-supervisor:ns/engine-0", hashlib.sha256).hexdigest()
    assert tokens_module().pod_token(KEY, "ns", "engine-0") == expected


@pytest.mark.parametrize(("namespace", "name"), [("", "p"), ("ns", ""), ("a/b", "p"), ("ns", "p/q")])
def test_a_pod_that_is_not_a_namespace_and_a_name_is_refused(namespace: str, name: str) -> None:
    t = tokens_module()
    with pytest.raises(ValueError, match="namespace"):
        t.pod_token(KEY, namespace, name)


def test_fleet_key_file_checks(tmp_path: Path) -> None:
    t = tokens_module()
    good = tmp_path / "key"
    good.write_text(KEY.hex() + "\n")
    assert t.read_fleet_key(good) == KEY.hex().encode()
    short = tmp_path / "short"
    short.write_text("0123456789abcdef")
    with pytest.raises(t.FleetKeyError) as caught:
        t.read_fleet_key(short)
    message = str(caught.value)
    assert str(short) in message and "16 bytes" in message and "openssl rand -hex 32" in message
    assert "0123456789abcdef" not in message
    with pytest.raises(t.FleetKeyError, match="unreadable"):
        t.read_fleet_key(tmp_path / "missing")


def test_derive_token_writes_the_pods_token_0600_and_never_prints_it(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(KEY.hex())
    out = tmp_path / "run" / "token"
    args = ["supervise", "derive-token", "--key-file", str(key), "--namespace", "ns", "--pod-name", "p-1"]
    result = CliRunner().invoke(main, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    token = out.read_text().strip()
    assert token == tokens_module().pod_token(KEY.hex().encode(), "ns", "p-1")
    assert out.stat().st_mode & 0o777 == 0o600
    assert token not in result.output and KEY.hex() not in result.output
    # an operator's way to one pod's token: stdout
    printed = CliRunner().invoke(main, [*args, "--out", "-"])
    # the printed answer is the contract: what the person who ran the command reads
    assert printed.exit_code == 0 and printed.stdout.strip() == token


def test_derive_token_bad_key_is_one_line_and_exit_2(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("tooshort")
    out = tmp_path / "token"
    result = CliRunner().invoke(
        main,
        [
            "supervise",
            "derive-token",
            "--key-file",
            str(key),
            "--namespace",
            "ns",
            "--pod-name",
            "p",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 2
    # the refusal is the contract: one line naming the value and what to do
    assert "fleet key" in result.stderr and "tooshort" not in result.output
    assert not out.exists()


# -- router flags -------------------------------------------------------------------------------------


def test_router_key_file_is_for_k8s_discovery_and_excludes_a_single_token(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(KEY.hex())
    token = tmp_path / "token"
    token.write_text("t" * 40)
    base = ["router", "--supervisor-token-key-file", str(key)]
    static = CliRunner().invoke(main, [*base, "--backend", "http://127.0.0.1:9"])
    assert static.exit_code == 2 and "--discovery k8s" in static.output
    k8s = ["--discovery", "k8s", "--namespace", "ns", "--selector", "app=x"]
    both = CliRunner().invoke(main, [*base, *k8s, "--supervisor-token-file", str(token)])
    assert both.exit_code == 2 and "not both" in both.output
    short = tmp_path / "short"
    short.write_text("abc")
    bad = CliRunner().invoke(main, ["router", "--supervisor-token-key-file", str(short), *k8s])
    assert bad.exit_code == 2 and "openssl rand -hex 32" in bad.output and "abc\n" not in bad.output


# -- the router's calls carry each endpoint's own token ----------------------------------------------


class PodSupervisor:
    """A scripted supervisor that accepts only its own pod's token: READY, then DRAINING on demand."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.refused: list[str] = []
        self.acks: list[dict[str, Any]] = []
        self.wakes: list[dict[str, Any]] = []
        self.lines: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def _authorized(self, request: web.Request) -> bool:
        if request.headers.get("Authorization") == f"Bearer {self.token}":
            return True
        self.refused.append(request.path)
        return False

    async def watch(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return web.json_response({"error": "wrong token"}, status=401)
        resp = web.StreamResponse()
        await resp.prepare(request)
        while True:
            line = await self.lines.get()
            await resp.write(orjson.dumps(line) + b"\n")

    async def ack(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "wrong token"}, status=401)
        assert request.content_type == "application/json"
        self.acks.append(await request.json())
        return web.json_response({"ok": True})

    async def wake(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "wrong token"}, status=401)
        self.wakes.append(await request.json())
        return web.json_response({"operation_id": "w"}, status=202)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/state/watch", self.watch)
        app.router.add_post("/v1/acks", self.ack)
        app.router.add_post("/v1/wake", self.wake)
        return app


async def serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def eventually(condition: Callable[[], object], what: str, within: float = 10.0) -> None:
    for _ in range(int(within / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not {what} after {within}s")


def state_line(epoch: int, state: str) -> dict[str, Any]:
    return {"type": "state", "epoch": epoch, "state": state, "reason": "r", "time": 0}


async def test_streams_acks_and_wakes_carry_each_endpoints_own_token() -> None:
    from corral.router.datapath.wake_on_demand import WakeOnDemand, WakeSettings
    from corral.router.discovery.supervisor_stream import per_pod_tokens

    key = KEY.hex().encode()
    t = tokens_module()
    pods = {
        "ns/a": PodSupervisor(t.pod_token(key, "ns", "a")),
        "ns/b": PodSupervisor(t.pod_token(key, "ns", "b")),
    }
    membership, metrics = Membership(), RouterMetrics()
    settings = StreamSettings(router_id="r", tokens=per_pod_tokens(key), heartbeat_seconds=0.5)
    streams = SupervisorStreams(membership, metrics, settings)
    servers = [serve(p.app()) for p in pods.values()]
    urls = [await anext(s) for s in servers]
    try:
        endpoints = {}
        for (name, pod), url in zip(pods.items(), urls, strict=True):
            endpoint = Endpoint(
                f"{url}/engine",
                state=EngineState.READY,
                reason="source",
                name=name,
                supervisor=SupervisorView(url),
            )
            endpoint.models = frozenset({"m"})
            membership.add(endpoint, "test")
            endpoints[name] = endpoint
            pod.lines.put_nowait(state_line(1, "STARTING"))  # acknowledged as a first non-READY state
        await streams.start()
        await eventually(lambda: all(p.acks for p in pods.values()), "both acknowledged")
        for pod in pods.values():
            pod.lines.put_nowait(state_line(2, "SLEEPING"))
        await eventually(
            lambda: all(
                e.supervisor and e.supervisor.state is EngineState.SLEEPING for e in endpoints.values()
            ),
            "both SLEEPING",
        )
        wake = WakeOnDemand(membership, settings.token_for, WakeSettings(0.05), metrics)
        await wake.hold("m")
        await eventually(lambda: any(p.wakes for p in pods.values()), "a wake asked for")
        assert [p.refused for p in pods.values()] == [[], []]
        assert all(e.supervisor and e.supervisor.link == "connected" for e in endpoints.values())
        assert sum(len(p.wakes) for p in pods.values()) == 1
    finally:
        await streams.stop()
        for s in servers:
            await s.aclose()


async def test_a_single_token_still_goes_to_every_supervisor() -> None:
    pod = PodSupervisor("one-token-for-all")
    membership, metrics = Membership(), RouterMetrics()
    streams = SupervisorStreams(
        membership, metrics, StreamSettings(router_id="r", token="one-token-for-all", heartbeat_seconds=0.5)
    )
    server = serve(pod.app())
    url = await anext(server)
    try:
        membership.add(
            Endpoint(url + "/e", state=EngineState.READY, reason="s", supervisor=SupervisorView(url)), "t"
        )
        pod.lines.put_nowait(state_line(1, "STARTING"))
        await streams.start()
        await eventually(lambda: pod.acks, "acknowledged")
        assert pod.refused == []
    finally:
        await streams.stop()
        await server.aclose()
