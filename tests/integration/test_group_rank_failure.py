"""The must-show of issue 14, item 4: under continuous streamed load through a router, killing one
worker rank of a TP-2 simulated engine takes its whole serving group (two TP-2 engines, `group=g0/2`)
out of routing within one membership event; no request reaches any member of the group after the
router's acknowledgement (the engines' own admission counts, and who answered what); the engine in no
group serves on; and RECOVER (the supervisor restarts the engine in place) brings the group back."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration.test_router_groups import (
    check_exits,
    check_nothing_reached_the_group,
    fail_and_recover,
)
from tests.support.group_load import group_fleet

TP2 = ("--tensor-parallel-size", "2")


async def test_killing_one_rank_takes_the_whole_group_out_and_recover_brings_it_back(tmp_path: Path) -> None:
    async with group_fleet(tmp_path, member_sim_args=TP2) as fleet:
        victim = fleet.members[0]
        state = victim.state()
        assert state["world_size"] == 2, state
        (rank1,) = [r for r in state["ranks"] if r["rank"] == 1 and r["alive"]]
        started = time.time()
        marks = await fail_and_recover(fleet, rank1["pid"], "rank 1 was killed")
        out = await fleet.end_load()
        fall = check_nothing_reached_the_group(fleet, marks["before"])
        assert "rank 1" in fall["reason"], fall  # FAILED names the rank
        check_exits(fleet, fall)
        # RECOVER, not a new supervisor: the same supervisor restarted its engine with both ranks
        recovered = victim.state()
        assert [r["rank"] for r in recovered["ranks"] if r["alive"]] == [0, 1], recovered["ranks"]
        restarts = [r for r in victim.oplog() if r["record"] == "engine_restart" and r["time"] > started]
        assert [r["cause"] for r in restarts] == ["rank_lost"], restarts
        assert out.completed > 0
