"""Cleanup verified on a supervised `corral sim`: a level-1 sleep then a wake leaves no CPU weight
backup (the wake's POSTCHECK says so from the engine's own figure); a dependency socket nobody listens
on any more and an old temp file in the state dir are named by `GET /v1/leftovers` and by `corral
verify`'s cleanup check; a live process holding the preload daemon's socket that is not the
supervisor's daemon is named as an orphan, and still at shutdown; a bundle switch's POSTCHECK finds the
replaced engine gone. Real processes, real sockets."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from corral.atomic_file import temp_name
from corral.fleet.checks.check import FAIL, PASS, WARN
from corral.fleet.checks.leftovers import check_cleanup
from corral.fleet.checks.probe import FleetTarget, look
from tests.integration.test_supervisor_failure_strategy import bundle_file
from tests.integration.test_supervisor_preload import daemon_command, preload_supervised
from tests.integration.test_supervisor_support import gone, http_json, short_tmp_dir, sim_command, supervised
from tests.support.procs import free_port
from tests.support.waits import wait_until

DEV = {"VLLM_SERVER_DEV_MODE": "1"}
SIM_ARGS = ("--enable-sleep-mode", "--weights-gib", "2", "--kv-cache-gib", "4")
SUP_ARGS = ("--propagation-timeout", "3", "--quiet-period", "0.3")


def _operation(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, op = http_json(url + path, "POST", body)
    assert status == 202, op
    op_url = f"{url}/v1/operations/{op['operation_id']}"
    wait_until(lambda: http_json(op_url)[1]["status"] != "running", 30, what=f"{path} finished")
    return http_json(op_url)[1]


def _postcheck(oplog: list[dict[str, Any]], op_id: str) -> dict[str, Any]:
    (step,) = [
        r
        for r in oplog
        if r["record"] == "runbook_step" and r["operation_id"] == op_id and r["step"] == "postcheck"
    ]
    return step


def _by_kind(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["kind"]: c for c in report["checks"]}


def _verify_cleanup(url: str) -> tuple[str, str]:
    async def run() -> tuple[str, str]:
        check = await check_cleanup(await look(FleetTarget(None, [("engine-0", url)])))
        return check.verdict, check.detail

    return asyncio.run(run())


def test_wake_leaves_no_cpu_backup_and_planted_leftovers_are_named() -> None:
    where = short_tmp_dir()
    dependency = where / "dep.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(dependency))
    listener.listen()
    gate = ("--wait-for", f"unix:{dependency}")
    with supervised(sim_args=SIM_ARGS, sup_args=(*SUP_ARGS, *gate), env=DEV) as sup:
        sup.wait_for("READY", lambda b: b.get("state") == "READY", 60)
        assert _operation(sup.url, "/v1/sleep", {"level": 1, "operation_id": "s1"})["status"] == "succeeded"
        assert http_json(sup.url + "/v1/state")[1]["sleep"]["level"] == 1
        wake = _operation(sup.url, "/v1/wake", {"operation_id": "w1"})
        assert wake["status"] == "succeeded", wake
        evidence = _postcheck(sup.oplog(), "w1")["evidence"]
        checks = _by_kind(evidence["leftovers"])
        print("wake POSTCHECK leftovers:", {k: (c["verdict"], c["reason"]) for k, c in checks.items()})
        assert checks["cpu_backup"]["verdict"] == "clean", checks["cpu_backup"]
        assert "0 bytes" in checks["cpu_backup"]["reason"]
        assert checks["stale_socket"]["verdict"] == "clean"  # the dependency socket answers
        assert evidence["figures"]["cpu_backup_bytes"] == 0

        status, now = http_json(sup.url + "/v1/leftovers")
        assert status == 200 and all(c["verdict"] != "found" for c in now["checks"]), now
        assert _verify_cleanup(sup.url)[0] == PASS

        listener.close()  # the peer dies: its socket file stays behind
        stale_tmp = temp_name(sup.state_dir / "runtime_adapters.json")
        stale_tmp.write_bytes(b"half a write")
        old = time.time() - 3600
        os.utime(stale_tmp, (old, old))
        status, now = http_json(sup.url + "/v1/leftovers")
        found = {c["kind"]: c for c in now["checks"] if c["verdict"] == "found"}
        assert set(found) == {"stale_socket", "temp_file"}, now
        assert found["stale_socket"]["found"][0]["path"] == str(dependency)
        assert found["temp_file"]["found"][0] == {
            "kind": "temp_file",
            "what": found["temp_file"]["found"][0]["what"],
            "path": str(stale_tmp),
            "pid": None,
            "bytes": len(b"half a write"),
        }
        verdict, detail = _verify_cleanup(sup.url)
        print("verify cleanup:", verdict, detail)
        assert verdict == WARN and str(dependency) in detail and str(stale_tmp) in detail


def test_an_orphan_holding_the_preload_socket_is_named_and_still_at_shutdown() -> None:
    daemon_socket = short_tmp_dir() / "wc.sock"
    # an earlier daemon's process still holds the socket's name (the new daemon replaces the file)
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
        "print('bound', flush=True); time.sleep(120)\n"
    )
    orphan = subprocess.Popen([sys.executable, "-c", code, str(daemon_socket)], stdout=subprocess.PIPE)
    try:
        assert orphan.stdout is not None and orphan.stdout.readline().strip() == b"bound"
        health = free_port()
        daemon = daemon_command(health, daemon_socket, "--startup-seconds", "0.5")
        sup = preload_supervised(daemon, health, daemon_socket, "copy", *SUP_ARGS)
        try:
            sup.wait_for("READY", lambda b: b.get("state") == "READY", 60)
            status, now = http_json(sup.url + "/v1/leftovers")
            assert status == 200, now
            orphaned = _by_kind(now)["orphaned_daemon"]
            print("orphaned_daemon:", orphaned)
            assert orphaned["verdict"] == "found" and orphaned["fails"]
            assert [f["pid"] for f in orphaned["found"]] == [orphan.pid]
            assert orphaned["found"][0]["path"] == str(daemon_socket)
            verdict, detail = _verify_cleanup(sup.url)
            assert verdict == FAIL and f"pid {orphan.pid}" in detail, detail
        finally:
            sup.proc.stop(grace=20)
        (record,) = [r for r in sup.oplog() if r["record"] == "leftovers"]
        shutdown = _by_kind(record)
        assert record["operation"] == "shutdown"
        assert [f["pid"] for f in shutdown["orphaned_daemon"]["found"]] == [orphan.pid]
        assert shutdown["old_process"]["verdict"] == "clean"  # the engine and its ranks are gone
    finally:
        orphan.kill()
        orphan.wait(10)


def test_a_bundle_switch_leaves_no_old_engine(tmp_path: Path) -> None:
    port = free_port()
    other = bundle_file(tmp_path, "other", sim_command(port, "--itl-ms", "3"))
    with supervised(engine_port=port, sup_args=(*SUP_ARGS, "--bundle", str(other))) as sup:
        old_pid = sup.wait_state("READY", timeout=60)["engine"]["pid"]
        switch = _operation(sup.url, "/v1/bundle", {"name": "other", "operation_id": "b1"})
        assert switch["status"] == "succeeded", switch
        checks = _by_kind(_postcheck(sup.oplog(), "b1")["evidence"]["leftovers"])
        print("switch POSTCHECK old_process:", checks["old_process"])
        assert checks["old_process"]["verdict"] == "clean" and checks["old_process"]["fails"]
        assert "earlier engine processes alive" in checks["old_process"]["reason"]
        assert gone(old_pid) and sup.state()["engine"]["pid"] != old_pid
