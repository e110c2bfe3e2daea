"""A host rollout of a prefill/decode fleet, without processes: its waves (no surge, so an identity-changing
switch of a one-pair fleet is refused), and a wave's order (PAIRS, prefill hosts, decode hosts, PAIRS) with
RECOVER of the hosts already switched when a later one fails. The router's /v1/fleet is served by a small
aiohttp app; a host's switch is a stand-in that changes what that app lists (the supervisor's runbook
operation is tested in tests/integration/test_rollout_hosts.py)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from corral.bundle_spec import BundleSpec
from corral.contracts.up import GroupMember
from corral.fleet.rollout.hosts import HostRollout
from corral.fleet.rollout.paired import plan_groups
from corral.fleet.rollout.pd_plan import PairLimits
from corral.fleet.rollout.steps import Group, RolloutJob, RolloutSettings, Step, StepFailed

V1, V2 = "pair-v1", "pair-v2"


def _host(i: int, role: str) -> Group:
    name = f"host-{i}"
    member = GroupMember(
        name=name, group=name, supervisor=f"http://sup-{i}", engine=f"http://eng-{i}", role=role
    )
    return Group(name, BundleSpec(name="v1"), [member], role)


def test_host_waves_move_a_pair_together_and_refuse_a_lone_pair() -> None:
    hosts = [_host(0, "prefill"), _host(1, "prefill"), _host(2, "decode"), _host(3, "decode")]
    pairings: dict[str, str | None] = {g.name: V1 for g in hosts}
    moving = {g.name for g in hosts}
    waves = plan_groups(hosts, pairings, moving, 1, False, PairLimits())
    assert [w.groups for w in waves] == [("host-0", "host-2"), ("host-1", "host-3")]
    assert all(w.together for w in waves) and waves[0].lowest.pairs == (V1,)
    # the first pair switched and reported the old identity: the rest move one host at a time
    pairings |= {"host-0": V1, "host-2": V1}
    rest = plan_groups(hosts, pairings, {"host-1", "host-3"}, 1, False, PairLimits())
    assert [w.groups for w in rest] == [("host-1",), ("host-3",)]
    # one prefill and one decode host: no spare, so a switch to an unknown identity keeps no pair
    lone = [_host(0, "prefill"), _host(1, "decode")]
    with pytest.raises(StepFailed, match="no complete compatible pair routable: hosts are switched in place"):
        plan_groups(lone, {"host-0": V1, "host-1": V1}, {"host-0", "host-1"}, 1, False, PairLimits(), True)
    # and --min-decode 2 on two decode hosts cannot move either of them
    with pytest.raises(StepFailed, match="below --min-decode 2"):
        plan_groups(hosts, {g.name: V1 for g in hosts}, moving, 1, False, PairLimits(1, 2), True)


def _endpoint(i: int, role: str, pairing: str) -> dict[str, Any]:
    return {
        "url": f"http://eng-{i}",
        "role": role,
        "pairing": pairing,
        "routable": True,
        "state": "READY",
        "supervisor": {"url": f"http://sup-{i}"},
    }


class _Switches(HostRollout):
    """HostRollout whose per-host move only records the order and relists the host on the target."""

    def __init__(self, fleet: dict[str, Any], fail: str | None, *args: Any) -> None:
        super().__init__(*args)
        self.fleet, self.fail, self.order = fleet, fail, []

    async def _move(self, old: Group) -> None:
        self.order.append(old.name)
        if old.name == self.fail:
            self.steps.append(Step("SWITCH", old.name, detail="refused"))
            raise StepFailed(f"{old.name}: refused")
        i = int(old.name.removeprefix("host-"))
        self.fleet["endpoints"][i]["pairing"] = V2

    async def _switch_back(self, step: Step, supervisor: str, bundle: str) -> None:
        self.order.append(f"back {supervisor} {bundle}")


@pytest.mark.parametrize("fail", [None, "host-2"])
async def test_a_wave_switches_prefill_before_decode_between_pairs_checks(fail: str | None) -> None:
    roles = ["prefill", "prefill", "decode", "decode"]
    fleet: dict[str, Any] = {
        "endpoints": [_endpoint(i, role, V1) for i, role in enumerate(roles)],
        "pairs": [{"model": "m", "prefill_routable": 2, "decode_routable": 2, "pairs": 1}],
    }

    async def listing(_: web.Request) -> web.Response:
        return web.json_response(fleet)

    app = web.Application()
    app.router.add_get("/v1/fleet", listing)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            job = RolloutJob(f"http://127.0.0.1:{server.port}", BundleSpec(name="v2"), RolloutSettings())
            rollout = _Switches(fleet, fail, [f"http://sup-{i}" for i in range(4)], session, job)
            wave = [_host(2, "decode"), _host(0, "prefill")]
            if fail is None:
                await rollout._move_wave("wave 1", wave)
                assert rollout.order == ["host-0", "host-2"]
                pairs = [s for s in rollout.steps if s.step == "PAIRS"]
                assert [s.data["when"] for s in pairs] == ["without the wave", "after the wave"]
                assert pairs[0].data["pairs"] == [V1] and "http://eng-0" not in pairs[0].data["routable"]
                assert pairs[1].data["pairs"] == [V1, V2]
            else:
                with pytest.raises(StepFailed, match="host-2: refused"):
                    await rollout._move_wave("wave 1", wave)
                # the prefill host switched first goes back: no new prefill engine stays without a partner
                assert rollout.order == ["host-0", "host-2", "back http://sup-0 v1"]
                assert [(s.step, s.group) for s in rollout.steps][-1] == ("RECOVER", "host-0")
            # a wave that would leave no pair stops at its first PAIRS, before any host moves
            rollout.order.clear()
            with pytest.raises(StepFailed, match="without the wave: no complete compatible pair"):
                await rollout._move_wave("wave 2", [_host(0, "prefill"), _host(1, "prefill")])
            assert rollout.order == []
    finally:
        await server.close()
