"""`corral status` on a real local fleet: bundle, in-flight, KV usage and adapters per engine, and a
`--watch` that keeps refreshing until Ctrl-C."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import orjson

from tests.integration.test_verify import local_fleet_file_under, start_up, stop
from tests.support.procs import CorralProcess
from tests.support.waits import wait_until


def test_status_shows_bundle_load_kv_and_adapters_and_watches(tmp_path: Path) -> None:
    adapter = tmp_path / "ad"
    adapter.mkdir()
    up, url = start_up(
        "--engines",
        "2",
        "--sim-arg=--enable-lora",
        f"--sim-arg=--lora-modules=ad1={adapter}",
        state_home=tmp_path,
    )
    port = url.rsplit(":", 1)[1]
    env = {"XDG_STATE_HOME": str(tmp_path), "COLUMNS": "250"}
    try:
        supervisor = httpx.get(url + "/v1/fleet").json()["endpoints"][0]["supervisor"]
        assert local_fleet_file_under(tmp_path, int(port)).exists() and supervisor
        shown = CorralProcess(["status", "--port", port], env=env)
        assert shown.wait_exit(30) == 0, shown.output()
        out = shown.output()
        for header in ("bundle", "in flight", "KV", "adapters"):
            # the printed answer is the contract: what the person who ran the command reads
            assert header in out, out
        assert out.count("ad1") >= 2 and out.count("run /") >= 2 and "%" in out, out
        fleet = orjson.loads(local_fleet_file_under(tmp_path, int(port)).read_bytes())
        auth = {"Authorization": "Bearer " + Path(fleet["supervisor_token_file"]).read_text().strip()}
        fingerprints = {
            httpx.get(e["supervisor"] + "/v1/state", headers=auth).json()["bundle"]["fingerprint"]
            for e in fleet["engines"]
        }
        assert len(fingerprints) == 1 and next(iter(fingerprints)) in out, out

        watching = CorralProcess(["status", "--port", port, "--watch", "--interval", "0.2"], env=env)
        try:
            wait_until(lambda: watching.output().count("Corral fleet at") >= 1, 20, "a first table")
            watching.signal(signal.SIGINT)
            assert watching.wait_exit(20) in (0, 130), watching.output()
            assert "READY" in watching.output()
        finally:
            watching.stop()
    finally:
        stop(up)
