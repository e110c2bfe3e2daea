"""Change records belong to the fleet (and run) they describe. A fleet stopped with Ctrl-C takes its
records into the runs archive (`runs/<fleet id>/`); a brand-new fleet on the same port starts with
none, and `corral rollback` and `corral verify` refuse a record an earlier fleet left (as one killed
with SIGKILL would), naming whose it is and what to do, instead of judging or undoing this fleet by it.

Real processes: two one-engine `corral up` fleets, one after the other, on one port."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from tests.integration.test_verify import stop
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until


def _up(port: int, state_home: Path) -> CorralProcess:
    proc = CorralProcess(
        ["up", "--port", str(port), "--engines", "1"], env={"XDG_STATE_HOME": str(state_home)}
    )
    wait_until(lambda: "router: " in proc.output() or proc.proc.poll() is not None, 90, "the router URL")
    # the printed line is the contract: it tells the person where to connect
    assert "router: " in proc.output(), proc.output()
    return proc


def _corral(state_home: Path, *args: str) -> tuple[int, str]:
    proc = CorralProcess(list(args), env={"XDG_STATE_HOME": str(state_home), "COLUMNS": "250"})
    code = proc.wait_exit(180)
    out = proc.output()
    proc.stop()
    return code, out


def _fleet_id(state: Path, port: int) -> str:
    fleet = orjson.loads((state / f"up-{port}.json").read_bytes())
    assert re.fullmatch(r"fleet-[0-9a-f]{12}", str(fleet.get("fleet_id"))), fleet
    assert str(fleet.get("fleet_run")).startswith("run-"), fleet
    return str(fleet["fleet_id"])


def test_a_new_fleet_on_the_port_refuses_the_records_of_the_one_before(tmp_path: Path) -> None:
    port, state = free_port(), tmp_path / "corral"
    bundle = tmp_path / "v2.yaml"
    bundle.write_text('name: v2\nengine_args: ["--version-string", "0.33.1"]\n')
    rollout_path, verify_path = state / f"rollout-{port}.json", state / f"verify-{port}.json"

    first = _up(port, tmp_path)
    try:
        old_id = _fleet_id(state, port)
        # a runbook operation's record, kept under its supervisor's port, names the fleet too
        engine = orjson.loads((state / f"up-{port}.json").read_bytes())["engines"][0]
        named = ("--port", str(port), "--engine", engine["name"])
        code, out = _corral(tmp_path, "sleep", *named, "--level", "1")
        assert code == 0, out
        sleep_path = state / f"sleep-{engine['supervisor'].rsplit(':', 1)[1]}.json"
        assert orjson.loads(sleep_path.read_bytes())["fleet_id"] == old_id
        code, out = _corral(tmp_path, "wake", *named)
        assert code == 0, out
        code, out = _corral(tmp_path, "rollout", "--port", str(port), "--to", str(bundle))
        assert code == 0, out
        code, out = _corral(tmp_path, "verify", "--port", str(port))
        assert code == 0, out
        old_rollout, old_verify = rollout_path.read_bytes(), verify_path.read_bytes()
        for record in (old_rollout, old_verify):
            assert orjson.loads(record)["fleet_id"] == old_id
    finally:
        stop(first)  # Ctrl-C: the fleet's records go into the archive with it
    archived = state / "runs" / old_id
    assert not rollout_path.exists() and not verify_path.exists(), sorted(p.name for p in state.iterdir())
    assert (archived / rollout_path.name).read_bytes() == old_rollout
    assert (archived / verify_path.name).read_bytes() == old_verify
    assert not sleep_path.exists() and (archived / sleep_path.name).exists()
    assert (archived / sleep_path.name.replace("sleep-", "wake-")).exists()
    # the printed line is the contract: the operator is told where the old records went
    assert f"archived this fleet's change records: {archived / verify_path.name}" in first.output()

    second = _up(port, tmp_path)
    try:
        new_id = _fleet_id(state, port)
        assert new_id != old_id
        # nothing of the old fleet's at the port: nothing to undo
        code, out = _corral(tmp_path, "rollback", "--port", str(port))
        assert code == 2, out
        assert f"no change record {rollout_path}: roll out first" in out, out

        # records an earlier fleet left where this one's go (a fleet killed with SIGKILL archives none)
        rollout_path.write_bytes(old_rollout)
        verify_path.write_bytes(old_verify)
        code, out = _corral(tmp_path, "rollback", "--port", str(port))
        assert code == 2, out
        said = " ".join(out.split())
        assert f"change record {rollout_path} belongs to fleet {old_id}" in said, out
        assert f"not to this fleet ({new_id}" in said and "corral rollout --to BUNDLE.yaml" in said, out
        assert "rollback of" not in out, out  # refused before anything moved

        code, out = _corral(tmp_path, "verify", "--port", str(port))
        assert code == 1, out
        said = " ".join(out.split())
        assert f"change record {verify_path} belongs to fleet {old_id}" in said, out
        assert "move it away" in said and "--record PATH" in said, out
        assert verify_path.read_bytes() == old_verify  # not judged by it, not overwritten

        # a rollout of this fleet writes its own record; the earlier fleet's goes to the archive
        code, out = _corral(tmp_path, "rollout", "--port", str(port), "--to", str(bundle))
        assert code == 0, out
        assert f"{rollout_path} was another fleet's record: archived as {archived}" in out, out
        assert orjson.loads(rollout_path.read_bytes())["fleet_id"] == new_id
        assert [p.read_bytes() for p in archived.glob("rollout-*.json")] == [old_rollout, old_rollout]
        rollout_path.write_bytes(old_rollout)

        # status shows this fleet's last change only, and names what it left out
        code, out = _corral(tmp_path, "status", "--port", str(port), "--json")
        shown = orjson.loads(out)
        assert shown["fleet"]["id"] == new_id and shown["last_change"] is None, shown
        assert len(shown["ignored_records"]) == 2, shown
        assert all(f"belongs to fleet {old_id}" in line for line in shown["ignored_records"]), shown

        # a record written before records named their fleet cannot be shown to be this fleet's
        legacy = {k: v for k, v in orjson.loads(old_verify).items() if k not in ("fleet_id", "fleet_run")}
        verify_path.write_bytes(orjson.dumps(legacy))
        rollout_path.unlink()
        code, out = _corral(tmp_path, "verify", "--port", str(port))
        assert code == 1, out
        assert f"change record {verify_path} names no fleet" in " ".join(out.split()), out

        # this fleet's own record is used as before
        verify_path.unlink()
        code, out = _corral(tmp_path, "verify", "--port", str(port))
        assert code == 0, out
        assert orjson.loads(verify_path.read_bytes())["fleet_id"] == new_id
        code, out = _corral(tmp_path, "status", "--port", str(port))
        said = " ".join(out.split())
        assert f"fleet {new_id}, run run-" in said and "last change: verify verify-" in said, out
        assert "ignored:" not in out, out
    finally:
        stop(second)
    assert (state / "runs" / new_id / verify_path.name).exists()
