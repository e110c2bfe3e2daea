"""`corral up --config deploy/examples/local/fleet.yaml` starts the fleet the file describes, and a
flag typed on the command line (--port) wins over the file."""

from __future__ import annotations

from pathlib import Path

from tests.integration.test_cli_fleet import status_json
from tests.integration.test_verify import start_up, stop
from tests.support.procs import CorralProcess

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local" / "fleet.yaml"


def test_the_example_fleet_file_starts(tmp_path: Path) -> None:
    up, url = start_up("--config", str(EXAMPLE), state_home=tmp_path)
    port = url.rsplit(":", 1)[1]
    try:
        assert port != "8000", url  # the typed --port, not the file's
        # the printed answer is the contract: what the person who ran the command reads
        assert "in 2 serving groups" in up.output(), up.output()
        code, body = status_json(port, tmp_path)
        assert code == 0 and [e["name"] for e in body["engines"]] == [f"engine-{i}" for i in range(4)], body
        assert {e["state"] for e in body["engines"]} == {"READY"}, body
    finally:
        stop(up)


def test_a_bad_fleet_file_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("engines: {count: 3, group_size: 2}\nrouter: {polcy: x}\n")
    proc = CorralProcess(["up", "--config", str(path)], env={"XDG_STATE_HOME": str(tmp_path)})
    try:
        assert proc.wait_exit(60) == 2
        out = proc.output()
        # the refusal is the contract: one line naming the value and what to do
        assert f"{path}: router.polcy: no such field" in out, out
    finally:
        proc.stop()
