"""`corral status` and `corral doctor` name the runbook step an operation is at, on a real `corral up`
fleet: a `corral sleep` whose drain waits on a stream held open is shown at DRAIN by `status --json`
(`operation_in_flight`, exit 3: changing), by the compact layout in a pipe (80 columns) and by `doctor`
(a Corral command to follow it); once it is over, none is shown, and the router's `/v1/fleet` has kept
each step begun and the end for the dashboard's recent events."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from tests.integration.test_dashboard_browser import hold_stream
from tests.integration.test_verify import local_fleet_file_under, start_up, stop
from tests.support.procs import CorralProcess
from tests.support.waits import wait_until


def corral(state: Path, *args: str) -> tuple[int, str]:
    proc = CorralProcess(list(args), env={"XDG_STATE_HOME": str(state)})
    try:
        return proc.wait_exit(120), proc.output()
    finally:
        proc.stop()


def engine_0(state: Path, port: str) -> tuple[int, dict[str, Any]]:
    code, out = corral(state, "status", "--port", port, "--json")
    body = orjson.loads(out)
    return code, next(e for e in body["engines"] if e["name"] == "engine-0")


def test_status_and_doctor_show_the_step_a_sleep_is_at(tmp_path: Path) -> None:
    # 60 ms a token: the held stream (450 tokens) keeps the drain open ~27 s unless released sooner (it
    # is, once status and doctor have looked); the drain's deadline is past it, so the drain waits for it
    up, url = start_up(
        "--engines", "1", "--drain-timeout", "120", "--sim-arg=--itl-ms=60", state_home=tmp_path
    )
    port = url.rsplit(":", 1)[1]
    release = threading.Event()
    try:
        fleet_file = json.loads(local_fleet_file_under(tmp_path, int(port)).read_text())
        engine = next(e["engine"] for e in fleet_file["engines"] if e["name"] == "engine-0")
        first_chunk = threading.Event()
        holder = threading.Thread(target=hold_stream, args=(engine, first_chunk, release), daemon=True)
        holder.start()
        assert first_chunk.wait(30), "the held stream sent nothing"
        sleep = CorralProcess(
            ["sleep", "--port", port, "--engine", "engine-0", "--level", "1"],
            env={"XDG_STATE_HOME": str(tmp_path)},
        )
        seen: list[tuple[int, dict[str, Any]]] = []

        def at_drain() -> bool:
            seen.append(engine_0(tmp_path, port))
            return (seen[-1][1]["operation_in_flight"] or {}).get("step") == "drain_policy"

        wait_until(at_drain, 60, "corral status showing the sleep at DRAIN")
        code, shown = seen[-1]
        assert code == 3 and shown["verdict"] == "moving" and shown["state"] == "DRAINING", shown
        op = shown["operation_in_flight"]
        assert op["kind"] == "sleep" and op["detail"] == "level 1" and op["step_name"] == "DRAIN", op
        assert op["text"].startswith("sleep (level 1) at DRAIN for "), op
        assert "sleep (level 1) at DRAIN" in shown["state_text"], shown

        code, out = corral(tmp_path, "status", "--port", port)  # a pipe: the compact layout
        assert code == 3 and all(len(line) <= 80 for line in out.splitlines()), out
        assert "changing state" in out and "sleep (level 1) at DRAIN for" in " ".join(out.split()), out

        code, out = corral(tmp_path, "doctor", "--port", port, "--json")
        finding = next(f for f in orjson.loads(out)["findings"] if f["engine"] == "engine-0")
        assert code == 1 and finding["branch"] == "not-ready/operation-in-flight", out
        assert finding["evidence"].startswith("an operation is in flight: sleep (level 1) at DRAIN since "), (
            out
        )
        assert finding["next"] == f"wait, or follow it with `corral status --port {port} --watch`", out

        release.set()  # the client goes away: the drain ends and the sleep goes on
        assert sleep.wait_exit(120) == 0, sleep.output()[-3000:]
        holder.join(30)
        code, shown = engine_0(tmp_path, port)
        assert code == 0 and shown["state"] == "SLEEPING" and shown["operation_in_flight"] is None, shown

        with urllib.request.urlopen(url + "/v1/fleet", timeout=30) as resp:
            steps = json.loads(resp.read())["operation_steps"]
        mine = [s for s in steps if s["name"] == "engine-0" and s["kind"] == "sleep"]
        assert [s["step"] for s in mine][:3] == ["precheck", "remove_from_routing", "drain_policy"], steps
        assert mine[-1]["ended"] and len({s["step"] for s in mine}) == len(mine), steps  # each step once
    finally:
        release.set()
        stop(up)
