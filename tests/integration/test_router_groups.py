"""A serving group in a real router (backends file `group=g0/2`, two supervised simulators, a third
engine in no group) under continuous streamed load: killing one member's engine takes the whole group
out of routing in the same membership event, nothing reaches either member after the router's
acknowledgement (read from the engines' own admission counts), the engine outside the group keeps
serving, and the supervisor's RECOVER brings the group back. /v1/fleet and /metrics say why."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from tests.integration.test_supervisor_confirmed_drain import wait_until
from tests.support.group_load import GroupFleet, acked_removal, group_fleet, next_ready
from tests.support.prom import sample, scrape


def group_whole_metric(fleet: GroupFleet) -> float | None:
    return sample(scrape(fleet.url + "/metrics"), "corral_router_serving_group_whole", group="g0")


async def fail_and_recover(fleet: GroupFleet, kill: int, what: str) -> dict[str, float]:
    """Kill `kill` (a pid of the first member's engine), wait for the group to leave routing and
    come back after RECOVER; returns the client-clock marks."""
    victim = fleet.members[0]
    before = time.time()
    os.kill(kill, signal.SIGKILL)
    await wait_until(lambda: not fleet.group()["whole"], 20, f"group g0 out after {what}")
    out_group = fleet.group()
    assert victim.engine_url in out_group["why"] and "FAILED" in out_group["why"], out_group
    assert group_whole_metric(fleet) == 0
    await asyncio.to_thread(victim.wait_state, "READY", 90)  # RECOVER: restarted in place
    await wait_until(lambda: fleet.group()["whole"], 20, "group g0 whole again")
    back = time.time()
    assert group_whole_metric(fleet) == 1
    await fleet.serving((0, 1), back, "both members answering again")
    return {"before": before, "back": back}


def check_nothing_reached_the_group(fleet: GroupFleet, before: float) -> dict[str, Any]:
    victim, peer = fleet.members
    removal = acked_removal(victim, before)
    ack, fall = removal["ack"], removal["fall"]
    assert ack["undispatched"] == 0, ack
    ready = next_ready(victim, fall["time"])
    for sup in (victim, peer):
        growth, _ = fleet.samplers[sup.engine_url].growth(ack["time"], ready["time"])
        assert growth == 0, f"{sup.engine_url} admitted {growth} requests after the router's acknowledgement"
    # the peer served on, unrouted, through the whole window: its count was read and never moved
    assert fleet.samplers[peer.engine_url].growth(ack["time"], ready["time"])[1] >= 2
    # requests sent after the ack were answered by the engine outside the group only
    assert fleet.answered_by(0, ack["time"], ready["time"]) == 0
    assert fleet.answered_by(1, ack["time"], ready["time"]) == 0
    assert fleet.answered_by(2, ack["time"], ready["time"]) > 0
    return fall


def check_exits(fleet: GroupFleet, fall: dict[str, Any]) -> None:
    """Both members left routing: the victim for its own state, the peer with its group, and why."""
    victim, peer = fleet.members
    exits = fleet.fleet()["left_routing"]
    (mine,) = [e for e in exits if e["url"] == victim.engine_url and e["cause"] == "supervisor_failed"]
    (theirs,) = [e for e in exits if e["url"] == peer.engine_url and e["cause"] == "group_out"]
    assert f"member {victim.engine_url} FAILED" in theirs["reason"], theirs
    assert fall["reason"][:40] in theirs["reason"], (fall["reason"], theirs["reason"])
    assert not [e for e in exits if e["url"] == fleet.loner.engine_url]
    assert theirs["at"] >= mine["at"]


async def test_a_member_engine_killed_takes_the_whole_group_out_and_recover_brings_it_back(
    tmp_path: Path,
) -> None:
    async with group_fleet(tmp_path) as fleet:
        assert fleet.group()["whole"] and fleet.group()["size"] == 2
        pid = fleet.members[0].state()["engine"]["pid"]
        marks = await fail_and_recover(fleet, pid, "its engine was killed")
        out = await fleet.end_load()
        fall = check_nothing_reached_the_group(fleet, marks["before"])
        assert "engine exited" in fall["reason"], fall
        check_exits(fleet, fall)
        assert out.completed > 0
