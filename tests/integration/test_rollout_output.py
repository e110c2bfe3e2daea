"""What `corral rollout` prints (issue 32): each step once, when it ends, naming the groups by the names
the fleet gives them (the new group's own name, never the rollout's working label `g0'`), and one
summary line instead of a table repeating every step."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from tests.integration.test_rollout import corral, stop_up
from tests.integration.test_up import start_up

STEP_LINE = re.compile(r"^([✓✗]) (\S+)\s+(\S*)\s+\d+\.\d\ds  ")


async def test_rollout_prints_each_step_once_with_the_fleets_group_names(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc, url = start_up("--engines", "2", state_home=state)
    port = url.rsplit(":", 1)[1]
    try:
        bundle = tmp_path / "v2.yaml"
        bundle.write_text('name: v2\nengine_args: ["--version-string", "0.33.1"]\n')
        code, output = await corral(state, "rollout", "--port", port, "--to", str(bundle))
        assert code == 0, output
        record = orjson.loads((state / "corral" / f"rollout-{port}.json").read_bytes())
        lines = output.splitlines()
        printed = [m.group(2, 3) for m in map(STEP_LINE.match, lines) if m]
        # every step of the record printed, once, in order, under the record's own group name
        assert printed == [(s["step"], s["group"] or "") for s in record["steps"]], output
        starts = [group for step, group in printed if step == "START"]
        assert starts == [move["new"] for move in record["replaced"]], output
        assert "'" not in " ".join(group for _, group in printed), output
        # nothing else repeats the steps: no "…" progress line (not a terminal), no table
        assert not [line for line in lines if line.startswith("…") or "┃" in line or "│" in line], output
        summary = [line for line in lines if line.startswith(f"rollout {record['id']} succeeded")]
        assert len(summary) == 1, output
        assert f"({len(record['steps'])} steps, 2 groups moved)" in summary[0], output
    finally:
        stop_up(proc)
