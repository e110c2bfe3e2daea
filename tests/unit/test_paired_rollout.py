"""A P/D rollout's own decisions, without processes: the next wave from the groups' measured pairing
identities (independent moves once the target is known to keep the old one), and the PAIRS step's
reading of a router's /v1/fleet (served here by a small aiohttp app standing in for the router)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from corral.bundle_spec import BundleSpec
from corral.clients.up import UpControlClient
from corral.contracts.up import GroupMember
from corral.fleet.rollout.paired import PairedRollout
from corral.fleet.rollout.steps import Group, RolloutJob, RolloutSettings, Step, StepFailed

V1, V2 = "pair-v1", "pair-v2"


def _group(name: str, role: str, bundle: str = "v1") -> Group:
    member = GroupMember(name=f"engine-{name}", group=name, supervisor="http://s", engine=f"http://{name}")
    return Group(name, BundleSpec(name=bundle), [member], role)


def _rollout(session: aiohttp.ClientSession, router: str, **settings: Any) -> PairedRollout:
    job = RolloutJob(router, BundleSpec(name="v2"), RolloutSettings(**settings))
    return PairedRollout(UpControlClient(session, "http://control", "t"), session, job)


async def test_the_next_wave_follows_the_measured_identity() -> None:
    async with aiohttp.ClientSession() as session:
        rollout = _rollout(session, "http://router")
        old = [
            _group("g0", "prefill"),
            _group("g1", "prefill"),
            _group("g2", "decode"),
            _group("g3", "decode"),
        ]
        rollout.pairings = {g.name: V1 for g in old}
        moving = {"g0", "g1", "g2", "g3"}
        assert rollout._plan(old, moving)[0].groups == ("g0", "g2")  # target unknown: together
        # after wave 1: its new groups reported the old identity, so the rest move one role at a time
        new = [_group("g4", "prefill", "v2"), _group("g5", "decode", "v2")]
        rollout.pairings |= {"g4": V1, "g5": V1}
        fleet = [old[1], old[3], *new]
        waves = rollout._plan(fleet, {"g1", "g3"})
        assert [w.groups for w in waves] == [("g1",), ("g3",)] and not waves[0].together
        # a new identity: the last old pair still moves as one
        rollout.pairings |= {"g4": V2, "g5": V2}
        assert [w.groups for w in rollout._plan(fleet, {"g1", "g3"})] == [("g1", "g3")]
        # --max-unavailable on a one-pair fleet: refused, naming what to change
        lone = _rollout(session, "http://router", max_surge=0, max_unavailable=1)
        lone.pairings = {"g0": V1, "g2": V1}
        with pytest.raises(StepFailed, match="no complete compatible pair routable: use --max-surge"):
            lone._plan([old[0], old[2]], {"g0", "g2"})


def _endpoint(url: str, role: str, pairing: str, routable: bool = True) -> dict[str, Any]:
    return {"url": url, "role": role, "pairing": pairing, "routable": routable, "state": "READY"}


async def test_pairs_reads_the_routers_fleet_without_the_leaving_engines() -> None:
    fleet: dict[str, Any] = {
        "endpoints": [
            _endpoint("http://p-old", "prefill", V1),
            _endpoint("http://d-old", "decode", V1),
            _endpoint("http://p-new", "prefill", V2),
            _endpoint("http://d-new", "decode", V2),
            _endpoint("http://d-down", "decode", V2, routable=False),
        ],
        "pairs": [{"model": "m", "prefill_routable": 2, "decode_routable": 2, "pairs": 2, "why": "routable"}],
    }

    async def listing(_: web.Request) -> web.Response:
        return web.json_response(fleet)

    app = web.Application()
    app.router.add_get("/v1/fleet", listing)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            rollout = _rollout(session, f"http://127.0.0.1:{server.port}", min_decode=1)
            step = Step("PAIRS", "wave 1")
            await rollout._pairs(step, {"http://p-old", "http://d-old"}, "without the old groups")
            assert step.data["pairs"] == [V2] and step.data["usable_decode"] == 1
            assert set(step.data["routable"]) == {"http://p-new", "http://d-new"}
            assert step.data["router_pairs"][0]["pairs"] == 2
            # with both prefill engines leaving, no decode engine pairs with anything
            with pytest.raises(StepFailed, match="without the old groups: no complete compatible pair"):
                await rollout._pairs(step, {"http://p-new", "http://p-old"}, "without the old groups")
            strict = _rollout(session, f"http://127.0.0.1:{server.port}", min_decode=2)
            with pytest.raises(StepFailed, match=r"1 usable decode engine\(s\), below --min-decode 2"):
                await strict._pairs(step, {"http://p-old"}, "without the old groups")
            fleet["pairs"][0]["pairs"] = 0  # the router's own count is required once nothing leaves
            with pytest.raises(StepFailed, match="the router lists no routable compatible pair"):
                await rollout._pairs(step, set(), "after the wave")
    finally:
        await server.close()
