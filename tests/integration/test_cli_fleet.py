"""The CLI finds its fleet, as a new user meets it: on the default `corral up` fleet (no bundle, no
extra flags), `corral status --json`, `corral sleep --port P --engine engine-0` and `wake`, and
`corral logs` work as typed; a missing or unknown engine name is a usage error naming the engines that
exist; status's compact layout fits 80 columns in a pipe and a planned sleep exits 0."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.integration.test_verify import start_up, stop
from tests.support.procs import CorralProcess


def corral(*args: str, state_home: Path) -> tuple[int, str]:
    proc = CorralProcess(list(args), env={"XDG_STATE_HOME": str(state_home), "COLUMNS": "250"})
    try:
        return proc.wait_exit(120), proc.output()
    finally:
        proc.stop()


def status_json(port: str, state_home: Path) -> tuple[int, dict]:
    code, out = corral("status", "--port", port, "--json", state_home=state_home)
    return code, orjson.loads(out)


def test_engines_by_name_on_the_default_fleet(tmp_path: Path) -> None:
    up, url = start_up(state_home=tmp_path)
    port = url.rsplit(":", 1)[1]
    try:
        # the printed answer is the contract: what the person who ran the command reads
        assert f"corral sleep --port {port} --engine engine-0" in up.output()
        code, body = status_json(port, tmp_path)
        assert code == 0 and body["schema"] == "corral.status/v1" and body["verdict"] == "settled", body
        names = [e["name"] for e in body["engines"]]
        assert names == ["engine-0", "engine-1"], body
        assert all(e["state"] == "READY" and e["supervisor"].startswith("http://") for e in body["engines"])

        code, out = corral("sleep", "--port", port, state_home=tmp_path)
        assert code == 2 and "engine-0, engine-1" in out and "--engine NAME" in out, out
        code, out = corral("sleep", "--port", port, "--engine", "engine-7", state_home=tmp_path)
        assert code == 2 and "no engine 'engine-7'" in out and "engine-0, engine-1" in out, out

        code, out = corral(
            "sleep", "--port", port, "--engine", "engine-0", "--level", "1", state_home=tmp_path
        )
        assert code == 0 and "succeeded" in out, out
        assert "/None" not in out, out  # progress lines say states in words
        code, body = status_json(port, tmp_path)
        asleep = next(e for e in body["engines"] if e["name"] == "engine-0")
        assert code == 0 and asleep["state"] == "SLEEPING" and asleep["verdict"] == "settled", body
        assert asleep["router"]["routable"] is False, body

        code, out = corral("status", "--port", port, state_home=tmp_path)  # a pipe: the compact layout
        assert code == 0, out
        assert all(len(line) <= 80 for line in out.splitlines()), out
        supervisors = [e["supervisor"] for e in body["engines"]]
        assert all(f"supervisor {s}" in out for s in supervisors) and "SLEEPING (level 1)" in out, out
        assert "…" not in out, out

        code, out = corral("logs", "--port", port, "--engine", "engine-0", "-n", "200", state_home=tmp_path)
        assert code == 0 and "asleep at level 1" in out, out

        code, out = corral("wake", "--port", port, "--engine", "engine-0", state_home=tmp_path)
        assert code == 0 and "succeeded" in out, out
        code, body = status_json(port, tmp_path)
        assert code == 0 and {e["state"] for e in body["engines"]} == {"READY"}, body
    finally:
        stop(up)
