"""`corral up --preload` (issue 29 item 5): each engine loads from its own weight-cache daemon, and a rollout
moves daemon and engine together — the new groups' engines start from new daemons on the new bundle's
vLLM, the retired groups' supervisors take their daemons down. Real processes: `corral up`, its
supervisors, `corral sim preload` daemons and `corral sim` engines; `corral rollout` and `corral rollback`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.integration.test_rollout import corral, fleet_file, read_token, stop_up
from tests.integration.test_verify import start_up
from tests.support.waits import wait_until

NEW = "0.99.0"


def daemons(fleet: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each engine's supervisor's daemon by engine name, and where its READY engine's weights came from."""
    found = {}
    auth = {"Authorization": f"Bearer {read_token(fleet, 'supervisor_token_file')}"}
    for engine in fleet["engines"]:
        state = httpx.get(engine["supervisor"] + "/v1/state", headers=auth, timeout=5).json()
        assert state["state"] == "READY", state
        found[engine["name"]] = {**state["preload"], "weights_from": state["evidence"].get("weights_from")}
    return found


async def test_up_preload_gives_each_engine_a_daemon_and_a_rollout_moves_them(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc, url = start_up("--engines", "2", "--preload", state_home=state)
    try:
        port = url.rsplit(":", 1)[1]
        first = daemons(fleet_file(state, url))
        assert len({d["pid"] for d in first.values()}) == 2, first  # one daemon per engine
        assert all(d["running"] and d["weights_from"] == "daemon" for d in first.values()), first
        bundle = tmp_path / "v2.yaml"
        bundle.write_text(f'name: v2\nengine_args: ["--version-string", "{NEW}"]\n')
        forward = await corral(state, "rollout", "--port", port, "--to", str(bundle))
        assert forward[0] == 0, forward[1]
        second = daemons(fleet_file(state, url))
        assert set(second).isdisjoint(first), (first, second)  # new groups, new engines
        assert all(d["version"] == NEW and d["weights_from"] == "daemon" for d in second.values()), second
        # the retired groups' supervisors stopped their daemons
        wait_until(
            lambda: not any(psutil.pid_exists(d["pid"]) for d in first.values()), 30, "old daemons gone"
        )
        back = await corral(state, "rollback", "--port", port)
        assert back[0] == 0, back[1]
        third = daemons(fleet_file(state, url))
        assert all(d["version"] != NEW and d["weights_from"] == "daemon" for d in third.values()), third
    finally:
        stop_up(proc)
