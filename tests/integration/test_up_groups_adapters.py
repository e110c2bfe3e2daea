"""`POST /v1/groups` without "adapters" on a local `corral up` fleet: the new group loads the union of
the serving groups' desired sets (adapters loaded at run time on different groups included) before it
answers 201, and two groups that want one adapter from two paths make it 422 naming the adapter, with
nothing started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from tests.integration.test_rollout import fleet_file, read_token, stop_up
from tests.integration.test_rollout_adapters import LORA, start_lora_fleet, supervisor_call


async def add_group(session: aiohttp.ClientSession, fleet: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {read_token(fleet)}"}
    body = {"bundle": {"name": "v2", "engine_args": [*LORA, "--version-string", "0.33.1"]}, "size": 1}
    async with session.post(fleet["control"] + "/v1/groups", json=body, headers=headers) as resp:
        answer: dict[str, Any] = await resp.json()
        return resp.status, answer


async def test_a_new_group_gets_the_union_of_the_groups_runtime_adapters(tmp_path: Path) -> None:
    state = tmp_path / "state"
    dirs = {name: tmp_path / name for name in ("adapter-x", "adapter-y", "adapter-z-1", "adapter-z-2")}
    for path in dirs.values():
        path.mkdir()
    proc, url = start_lora_fleet(state)
    try:
        fleet = fleet_file(state, url)
        token = read_token(fleet, "supervisor_token_file")
        first, second = fleet["engines"]
        assert first["group"] != second["group"], fleet["engines"]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

            async def load(engine: dict[str, Any], name: str, path: Path) -> None:
                op = await supervisor_call(
                    session, engine["supervisor"], token, "/v1/lora/load", {"name": name, "path": str(path)}
                )
                assert op["status"] == "succeeded", op

            await load(first, "adapter-x", dirs["adapter-x"])
            await load(second, "adapter-y", dirs["adapter-y"])
            status, body = await add_group(session, fleet)
            assert status == 201, body
            (member,) = body["members"]
            wanted = ["adapter-x", "adapter-y"]
            assert member["adapters"] == wanted, member
            state_of = await supervisor_call(session, member["supervisor"], token, "/v1/state")
            assert state_of["adapters"]["served"] == wanted, state_of["adapters"]
            assert sorted(state_of["adapters"]["runtime"]) == wanted, state_of["adapters"]
            assert body["name"] in {e["group"] for e in fleet_file(state, url)["engines"]}

            # one adapter wanted from two paths: no union; 422 naming it, nothing new started
            await load(first, "adapter-z", dirs["adapter-z-1"])
            await load(second, "adapter-z", dirs["adapter-z-2"])
            before = {e["name"] for e in fleet_file(state, url)["engines"]}
            status, body = await add_group(session, fleet)
            assert status == 422, body
            assert "adapter-z" in body["error"]["message"], body
            assert {e["name"] for e in fleet_file(state, url)["engines"]} == before
    finally:
        stop_up(proc)
