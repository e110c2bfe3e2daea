"""`corral verify` against real local fleets: passes on a healthy one, and fails naming the check on a
sleeping engine, a stale adapter, a fallback-to-disk event and a router that routes to a stopped engine."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import httpx
import orjson

from tests.support.procs import CorralProcess, free_port, start_sim
from tests.support.waits import wait_until


def start_up(*extra: str, state_home: Path, env: dict[str, str] | None = None) -> tuple[CorralProcess, str]:
    """`corral up` on a free port with its fleet file under `state_home`; returns it and the router URL."""
    port = free_port()
    proc = CorralProcess(
        ["up", "--port", str(port), *extra], env={"XDG_STATE_HOME": str(state_home), **(env or {})}
    )
    wait_until(lambda: "router: " in proc.output() or proc.proc.poll() is not None, 90, "the router URL")
    match = re.search(r"router: (http://\S+)", proc.output())
    # the printed line is the contract: it tells the person where to connect
    assert match, proc.output()
    return proc, match.group(1)


def local_fleet_file_under(state_home: Path, port: int) -> Path:
    return state_home / "corral" / f"up-{port}.json"


def verify(*args: str, state_home: Path) -> tuple[int, str]:
    env = {"XDG_STATE_HOME": str(state_home), "COLUMNS": "200"}
    proc = CorralProcess(["verify", *args], env=env)
    code = proc.wait_exit(60)
    return code, proc.output()


def failed_checks(out: str) -> list[str]:
    match = re.search(r"FAILED: (.*)", out)
    return match.group(1).strip().split(", ") if match else []


def stop(proc: CorralProcess) -> None:
    proc.signal(signal.SIGINT)
    assert proc.wait_exit(60) == 0, proc.output()


def test_a_healthy_fleet_passes_and_a_sleeping_engine_fails_the_sleep_check(tmp_path: Path) -> None:
    up, url = start_up(
        "--engines",
        "2",
        "--sim-arg=--enable-sleep-mode",
        state_home=tmp_path,
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    port = url.rsplit(":", 1)[1]
    try:
        code, out = verify("--port", port, "--expect-model", "sim-model", state_home=tmp_path)
        assert code == 0, out
        record = orjson.loads((tmp_path / "corral" / f"verify-{port}.json").read_bytes())
        assert record["ok"] and record["failed"] == []
        assert {c["check"] for c in record["checks"]} >= {"bundle", "membership", "smoke", "evidence"}
        fingerprints = {e["bundle"]["fingerprint"] for e in record["engines"]}
        assert len(fingerprints) == 1 and None not in fingerprints
        assert isinstance(record["ttft_ms"], float)

        # behind Corral's back, on the engine itself (its admission gate does not forward /sleep)
        fleet = orjson.loads(local_fleet_file_under(tmp_path, int(port)).read_bytes())
        token = Path(fleet["supervisor_token_file"]).read_text().strip()
        state = httpx.get(
            fleet["engines"][0]["supervisor"] + "/v1/state", headers={"Authorization": f"Bearer {token}"}
        ).json()
        engine = state["engine"]["url"]
        assert httpx.post(engine + "/sleep", params={"level": 1}, timeout=10).status_code == 200
        code, out = verify("--port", port, state_home=tmp_path)
        assert code == 1, out
        assert "sleep" in failed_checks(out), out
    finally:
        stop(up)


def test_a_stale_adapter_fails_the_adapters_check(tmp_path: Path) -> None:
    adapter = tmp_path / "old-adapter"
    adapter.mkdir()
    up, url = start_up(
        "--engines",
        "1",
        "--sim-arg=--enable-lora",
        f"--sim-arg=--lora-modules=old={adapter}",
        state_home=tmp_path,
    )
    port = url.rsplit(":", 1)[1]
    try:
        code, out = verify("--port", port, "--expect-adapter", "old", state_home=tmp_path)
        assert code == 0, out
        code, out = verify("--port", port, "--expect-adapter", "new", state_home=tmp_path)
        assert code == 1, out
        assert failed_checks(out) == ["adapters"], out
        assert "old" in out
    finally:
        stop(up)


def test_a_fallback_to_disk_fails_the_evidence_check_unless_explained(tmp_path: Path) -> None:
    loader = orjson.dumps({"socket_path": str(tmp_path / "no-daemon.sock"), "fallback": True}).decode()
    up, url = start_up(
        "--engines",
        "1",
        "--sim-arg=--load-format=ipc_cache",
        f"--sim-arg=--model-loader-extra-config={loader}",
        state_home=tmp_path,
    )
    port = url.rsplit(":", 1)[1]
    try:
        code, out = verify("--port", port, state_home=tmp_path)
        assert code == 1, out
        assert failed_checks(out) == ["evidence"], out
        assert "fallback" in out
        code, out = verify(
            "--port", port, "--explain", "fallback=no daemon on this host", state_home=tmp_path
        )
        assert code == 0, out
    finally:
        stop(up)


def test_a_router_that_still_routes_to_a_stopped_engine_fails_the_membership_check(tmp_path: Path) -> None:
    sim, engine_url = start_sim()
    port = free_port()
    router = CorralProcess(
        ["router", "--port", str(port), "--backend", engine_url, "--models-refresh-seconds", "600"]
    )
    router_url = f"http://127.0.0.1:{port}"
    try:
        router.wait_http(router_url + "/health")
        code, out = verify("--router", router_url, state_home=tmp_path)
        assert code == 0, out
        sim.stop()
        endpoints = httpx.get(router_url + "/v1/fleet").json()["endpoints"]
        assert [e["routable"] for e in endpoints] == [True]  # the router has not noticed
        code, out = verify("--router", router_url, state_home=tmp_path)
        assert code == 1, out
        assert "membership" in failed_checks(out), out
    finally:
        router.stop()
        sim.stop()
