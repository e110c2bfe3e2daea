"""A peer router is input from another host (`--peer`, issue 28): one that answers garbage, too much,
too many picks, compressed bodies, the wrong status, or nothing in time is refused page by page and
backed off from, and nothing of it is applied. Served here by a real HTTP server on loopback; the
follower reads it as the router does. A real router pointed at such a peer keeps routing."""

from __future__ import annotations

import asyncio
import gzip
import json
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from corral.router.routing.peer_follower import PeerFollower, PeerFollowers
from corral.router.routing.peer_wire import MAX_PAGE_BYTES, MAX_PAGE_PICKS, PEER_PICKS_PATH
from corral.router.routing.prompt import MAX_KEYS
from corral.router.routing.worker_journal import WorkerJournals
from tests.integration.test_router_passthrough import SIM_ARGS
from tests.support.prefix_routers import ask, prefix_router_args, until_serving
from tests.support.procs import CorralProcess, free_port, start_sim
from tests.unit.test_worker_journal import Worker

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _page(**change: object) -> bytes:
    page = {"incarnation": "h", "cursor": "1", "more": False, "urls": ["http://10.0.0.0:8000"]}
    page |= {"policies": ["prefix"], "picks": [[0, 0, 0, [1]]]}
    return orjson.dumps(page | change)


async def _chunked_flood(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    await resp.prepare(request)
    for _ in range(64):  # 4 MiB with no Content-Length
        await resp.write(b"[" * 65536)
    return resp


async def _slow(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(30)
    return web.Response(body=_page())


def _body(body: bytes, **headers: str) -> Handler:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, headers=headers, content_type="application/json")

    return answer


def _status(status: int) -> Handler:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, text="no")

    return answer


HOSTILE: dict[str, Handler] = {
    "garbage": _body(b"\x00\xffnot json at all"),
    "too-large-declared": _body(b"{" * (MAX_PAGE_BYTES + 10)),
    "too-large-chunked": _chunked_flood,
    "too-many-picks": _body(_page(picks=[[0, 0, 0, [1]]] * (MAX_PAGE_PICKS + 1))),
    "huge-key-list": _body(_page(picks=[[0, 0, 0, list(range(MAX_KEYS + 1))]])),
    "wrong-types": _body(_page(picks=[["0", None, "x", {}]])),
    "key-past-64-bits": _body(_page().replace(b"[1]", b"[" + str(1 << 70).encode() + b"]")),
    "gzip": _body(gzip.compress(_page()), **{"Content-Encoding": "gzip"}),
    "refused-401": _status(401),
    "error-500": _status(500),
    "redirect": _status(302),
    "slow": _slow,
}


class HostilePeer:
    """A real HTTP server on loopback answering the peer route as `how` says."""

    def __init__(self) -> None:
        self.how = "garbage"
        self.asked = 0
        self.url = ""

    async def answer(self, request: web.Request) -> web.StreamResponse:
        self.asked += 1
        return await HOSTILE[self.how](request)


@pytest.fixture
async def hostile_peer() -> AsyncIterator[HostilePeer]:
    peer = HostilePeer()
    app = web.Application()
    app.router.add_get(PEER_PICKS_PATH, peer.answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    peer.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield peer
    await runner.cleanup()


@pytest.mark.parametrize("how", sorted(HOSTILE))
async def test_a_hostile_page_is_refused_and_nothing_applied(hostile_peer: HostilePeer, how: str) -> None:
    hostile_peer.how = how
    worker = Worker(WorkerJournals(1), 1, 2)
    assert worker.sync is not None
    policies = worker.routing.selector.policies
    follower = PeerFollower(
        hostile_peer.url, "t", worker.membership.get, worker.memory, policies, worker.sync, relay=False
    )
    followers = PeerFollowers([follower])
    await followers.start()
    try:
        # the poller asks, is refused, backs off and asks again: nothing it read is applied
        async with asyncio.timeout(30):
            while hostile_peer.asked < 2 or follower.failures < 2:  # noqa: ASYNC110 (a counter, no event)
                await asyncio.sleep(0.05)
    finally:
        await followers.stop()
    assert follower.applied == 0 and not follower.up and follower.last_error
    assert "t" not in (follower.last_error or "").split()
    assert sum(worker.memory.placed(e) for e in worker.membership.endpoints()) == 0


async def test_a_router_keeps_routing_beside_a_peer_that_floods_or_stalls(
    hostile_peer: HostilePeer, tmp_path: Path
) -> None:
    token = tmp_path / "peer.token"
    token.write_text("secret")
    sim, engine = await asyncio.to_thread(start_sim, None, *SIM_ARGS)
    port = free_port()
    router = CorralProcess(prefix_router_args(port, [engine], peers=[hostile_peer.url], token=token))
    url = f"http://127.0.0.1:{port}"
    try:
        await asyncio.to_thread(until_serving, router, url, 1)
        for how in ("too-large-chunked", "slow", "garbage", "too-many-picks"):
            hostile_peer.how = how
            asked = hostile_peer.asked
            for turn in range(5):
                await asyncio.to_thread(ask, url, turn, turn)  # 200 each, or ask() fails
            async with asyncio.timeout(30):  # the peer is asked, and answers its way, meanwhile
                while hostile_peer.asked == asked:  # noqa: ASYNC110 (a counter, no event)
                    await asyncio.sleep(0.05)

        def following() -> dict[str, object]:
            with urllib.request.urlopen(url + "/v1/fleet", timeout=2.0) as resp:
                return dict(json.loads(resp.read())["peers"]["following"][0])

        state = await asyncio.to_thread(following)
        assert state["applied"] == 0 and state["failures"] and not state["up"], state
        # the log is the contract here: no secret ever reaches it
        assert "secret" not in router.output()
    finally:
        await asyncio.to_thread(router.stop)
        await asyncio.to_thread(sim.stop)
