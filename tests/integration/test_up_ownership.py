"""`corral up` owns only its own fleet: a router port in use is one line and exit 2 before anything
starts, a second fleet on a running fleet's port never touches the running fleet's files, and every
fleet's supervisors want a per-fleet token that the CLI finds through the fleet file."""

from __future__ import annotations

import re
import socket
import stat
from pathlib import Path

import httpx
import orjson
import psutil

from tests.integration.test_verify import local_fleet_file_under, start_up, stop
from tests.support.procs import CorralProcess, free_port


def test_a_port_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = CorralProcess(["up", "--port", str(port)], env={"XDG_STATE_HOME": str(tmp_path)})
        code = proc.wait_exit(30)
        out = proc.output().strip()
        proc.stop()
    assert code == 2, out
    # the refusal is the contract: one line naming the value and what to do
    assert re.fullmatch(rf"corral up: port {port} is in use by another process; try --port \d+", out), out
    assert not list((tmp_path / "corral").glob("up-*")) if (tmp_path / "corral").exists() else True


def test_a_second_fleet_on_the_same_port_leaves_the_running_one_alone(tmp_path: Path) -> None:
    up, url = start_up("--engines", "1", state_home=tmp_path)
    port = int(url.rsplit(":", 1)[1])
    env = {"XDG_STATE_HOME": str(tmp_path), "COLUMNS": "200"}
    try:
        files = sorted((tmp_path / "corral").glob(f"up-{port}*"))
        before = {f: f.read_bytes() for f in files}
        second = CorralProcess(["up", "--port", str(port), "--engines", "1"], env=env)
        code = second.wait_exit(60)
        out = second.output()
        second.stop()
        assert code == 2, out
        # the refusal is the contract: one line naming the value and what to do
        assert f"port {port} is in use by another process; try --port" in out, out
        assert "fleet ready" not in out and "starting" not in out, out
        assert {f: f.read_bytes() for f in files if f.exists()} == before  # nothing deleted or rewritten

        # the running fleet: its supervisors want the fleet's own token, which the CLI finds
        fleet = orjson.loads(local_fleet_file_under(tmp_path, port).read_bytes())
        assert fleet["pid"] == up.pid and psutil.pid_exists(fleet["pid"])
        token_file = Path(fleet["supervisor_token_file"])
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        supervisor = fleet["engines"][0]["supervisor"]
        assert httpx.get(supervisor + "/v1/state").status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.get(supervisor + "/v1/state", headers=auth).json()["state"] == "READY"
        endpoints = httpx.get(url + "/v1/fleet").json()["endpoints"]
        assert [e["supervisor"]["stream"] for e in endpoints] == ["connected"]  # the router has it too
        shown = CorralProcess(["status", "--port", str(port)], env=env)
        assert shown.wait_exit(30) == 0, shown.output()
        assert "READY" in shown.output() and "answered 401" not in shown.output(), shown.output()
    finally:
        stop(up)
    assert not list((tmp_path / "corral").glob(f"up-{port}*"))  # its files go with the fleet


def test_a_state_home_that_cannot_be_used_is_one_line_and_exit_2(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "state"
    not_a_dir.write_text("a file\n")
    proc = CorralProcess(["up", "--port", str(free_port())], env={"XDG_STATE_HOME": str(not_a_dir)})
    code = proc.wait_exit(30)
    out = proc.output().strip()
    proc.stop()
    assert code == 2, out
    # the refusal is the contract: one line naming the value and what to do
    assert out.count("\n") == 0 and out.startswith("corral up: ") and str(not_a_dir) in out, out
