"""`--on-startup-failure` end to end over a real supervised `corral sim` whose start fails (it requires a
file that is not there, so it exits 1 at engine init): restart (today's bounded restarts, then FAILED and
/livez 503), stay-unready (held FAILED with /livez and /startupz 200, nothing restarting, an operator's
bundle switch still possible), rollback to a declared bundle (READY on it, the rollback recorded), and a
rollback bundle that fails too (FAILED once, no ping-pong)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from tests.integration.test_supervisor_support import Supervised, http_json, sim_command, supervised
from tests.support.procs import free_port

MISSING = "file:/nonexistent/corral-failure-strategy/weights"


def failing_sim(port: int) -> list[str]:
    return sim_command(port, "--requires", MISSING)


def bundle_file(tmp_path: Path, name: str, command: list[str]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({"name": name, "command": command}))  # JSON is YAML
    return path


def engine_alive(sup: Supervised) -> bool:
    return any(psutil.pid_exists(pid) and not _zombie(pid) for pid in sup.engine_pids())


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def rollback_steps(sup: Supervised) -> list[dict[str, Any]]:
    return [r for r in sup.oplog() if r["record"] == "runbook_step" and r["kind"] == "rollback"]


def test_restart_is_todays_bounded_restarts_then_failed_and_not_live() -> None:
    port = free_port()
    with supervised(
        engine_port=port, engine_cmd=failing_sim(port), sup_args=("--startup-restarts", "1")
    ) as sup:
        body = sup.wait_for("FAILED", lambda b: b.get("sub_state") == "gave_up", 60)
        assert body["state"] == "FAILED" and "--startup-restarts 1 spent" in body["reason"]
        assert len(body["restarts"]) == 1 and len(sup.engine_pids()) == 2
        assert body["on_startup_failure"] == "restart"
        assert body["startup_failure"]["verdict"] == "gave_up"
        assert body["evidence"]["on_startup_failure"] == "restart"
        assert sup.probe("/livez")[0] == 503
        assert sup.probe("/startupz")[0] == 503


def finished_operation(sup: Supervised, op_id: str) -> dict[str, Any]:
    """The operation once it ended: READY comes at VERIFY, POSTCHECK and the change record follow."""
    deadline = time.monotonic() + 30
    while (finished := http_json(f"{sup.url}/v1/operations/{op_id}")[1])["status"] == "running":
        assert time.monotonic() < deadline, finished
        time.sleep(0.1)
    return dict(finished)


def test_stay_unready_holds_the_pod_live_unready_and_restarts_nothing(tmp_path: Path) -> None:
    port = free_port()
    good = bundle_file(tmp_path, "good", sim_command(port))
    with supervised(
        engine_port=port,
        engine_cmd=failing_sim(port),
        sup_args=("--startup-restarts", "0", "--on-startup-failure", "stay-unready", "--bundle", str(good)),
    ) as sup:
        body = sup.wait_for("held", lambda b: b.get("sub_state") == "stay_unready", 60)
        assert body["state"] == "FAILED" and "exited with code 1" in body["reason"]
        assert body["startup_failure"] == {
            "bundle": "initial",
            "reason": body["reason"],
            "verdict": "stay_unready",
            "strategy": "stay-unready",
        }
        status, livez = sup.probe("/livez")
        assert status == 200 and livez["live"] is True and "stay-unready" in livez["live_reason"]
        status, readyz = sup.probe("/readyz")
        assert status == 503 and "exited with code 1" in readyz["reason"]
        status, startupz = sup.probe("/startupz")
        assert status == 200 and startupz["held_unready"] is True and startupz["started"] is False
        epoch = body["epoch"]
        sup.quiet_for(3, epoch)  # watched, by the supervisor's own clock: nothing restarts by itself
        assert len(sup.engine_pids()) == 1 and not engine_alive(sup)
        assert psutil.Process(sup.proc.pid).children(recursive=True) == []  # no engine in the process list
        assert sup.state()["epoch"] == epoch and sup.probe("/livez")[0] == 200
        # an operator can still switch the bundle from the held failure
        status, op = http_json(sup.url + "/v1/bundle", "POST", {"name": "good"})
        assert status == 202, op
        body = sup.wait_state("READY", timeout=60)
        assert body["bundle_name"] == "good"
        finished = finished_operation(sup, op["operation_id"])
        assert finished["status"] == "succeeded", finished
        precheck = finished["result"]["steps"][0]["evidence"]
        assert precheck["from"] == "initial" and "exited with code 1" in precheck["failed_start"]


def test_rollback_switches_to_the_declared_bundle_and_records_why(tmp_path: Path) -> None:
    port = free_port()
    good = bundle_file(tmp_path, "good", sim_command(port))
    with supervised(
        engine_port=port,
        engine_cmd=failing_sim(port),
        sup_args=("--startup-restarts", "0", "--bundle", str(good), "--on-startup-failure", "rollback=good"),
    ) as sup:
        body = sup.wait_state("READY", timeout=90)
        assert body["bundle_name"] == "good" and body["on_startup_failure"] == "rollback=good"
        failure = body["startup_failure"]
        assert failure["bundle"] == "initial" and failure["verdict"] == "rolling_back"
        assert failure["rollback_to"] == "good" and "exited with code 1" in failure["reason"]
        [op] = [o for o in body["operations"] if o["kind"] == "rollback"]
        assert finished_operation(sup, op["operation_id"])["status"] == "succeeded"
        steps = rollback_steps(sup)
        assert [s["step"] for s in steps] == [
            "precheck",
            "remove_from_routing",
            "drain_policy",
            "execute",
            "verify",
            "postcheck",
        ]
        assert steps[0]["evidence"]["from"] == "initial" and steps[0]["evidence"]["to"] == "good"
        assert "exited with code 1" in steps[0]["evidence"]["failed_start"]
        assert len(sup.engine_pids()) == 2
        assert sup.probe("/readyz")[0] == 200
        restarted = [t for t in sup.transitions() if t["from"] == "FAILED" and t["to"] == "STARTING"]
        assert len(restarted) == 1 and "rollback to good" in restarted[0]["reason"]


def test_a_rollback_bundle_that_fails_too_ends_failed_without_ping_pong(tmp_path: Path) -> None:
    port = free_port()
    bad = bundle_file(tmp_path, "also-bad", failing_sim(port))
    with supervised(
        engine_port=port,
        engine_cmd=failing_sim(port),
        sup_args=(
            "--startup-restarts",
            "0",
            "--bundle",
            str(bad),
            "--on-startup-failure",
            "rollback=also-bad",
        ),
    ) as sup:
        body = sup.wait_for(
            "the rollback failed",
            lambda b: any(o["kind"] == "rollback" and o["status"] == "failed" for o in b["operations"]),
            90,
        )
        assert body["state"] == "FAILED" and body["sub_state"] == "gave_up"
        assert "rollback to also-bad failed" in body["reason"]
        assert "the start of initial had failed" in body["reason"]
        assert body["bundle_name"] == "also-bad"
        sup.quiet_for(3, body["epoch"])  # by the supervisor's own clock: no second rollback, no restart
        assert len(sup.engine_pids()) == 2 and not engine_alive(sup)
        assert psutil.Process(sup.proc.pid).children(recursive=True) == []
        assert sup.state()["epoch"] == body["epoch"]
        assert sup.probe("/livez")[0] == 503
        [recover] = [s for s in rollback_steps(sup) if s["step"] == "recover"]
        assert "nothing to go back to" in recover["evidence"]["outcome"]


def test_a_rollback_to_an_undeclared_bundle_is_refused_at_parse_time(tmp_path: Path) -> None:
    good = bundle_file(tmp_path, "good", sim_command(1))
    result = subprocess.run(
        [
            *(sys.executable, "-m", "corral", "supervise", "--port", "1", "--state-dir", str(tmp_path / "s")),
            *("--bundle", str(good), "--on-startup-failure", "rollback=prev", "--", *sim_command(1)),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result
    # the refusal is the contract: one line naming the value and what to do
    assert "'prev' is not declared" in result.stderr and "good" in result.stderr
    assert not (tmp_path / "s").exists()


def test_a_precheck_refusal_is_decided_by_the_strategy_too(tmp_path: Path) -> None:
    """PRECHECK refuses the configured command (a fingerprint it cannot match): never retried, no engine
    started; stay-unready holds it, rollback starts the declared bundle (not pinned, so authorized)."""
    port = free_port()
    good = bundle_file(tmp_path, "good", sim_command(port))
    pinned = ("--startup-restarts", "3", "--expect-fingerprint", "0123456789abcdef", "--bundle", str(good))
    with supervised(
        engine_port=port, sim_args=(), sup_args=(*pinned, "--on-startup-failure", "stay-unready")
    ) as sup:
        body = sup.wait_for("held", lambda b: b.get("sub_state") == "stay_unready", 60)
        assert body["reason"].startswith("PRECHECK refused the start"), body["reason"]
        assert body["restarts"] == [] and sup.engine_pids() == []
        assert sup.probe("/livez")[0] == 200 and sup.probe("/readyz")[0] == 503
    with supervised(
        engine_port=port, sim_args=(), sup_args=(*pinned, "--on-startup-failure", "rollback=good")
    ) as sup:
        body = sup.wait_state("READY", timeout=90)
        assert body["bundle_name"] == "good"
        assert body["startup_failure"]["reason"].startswith("PRECHECK refused the start")
        assert len(sup.engine_pids()) == 1  # only the rollback's engine: the refused one never started
        outcomes = [r["outcome"] for r in sup.oplog() if r["record"] == "precheck"]
        assert outcomes == ["refused", "authorized"], outcomes


def test_a_usage_error_is_not_retried_and_its_error_line_is_the_reason() -> None:
    """An unknown engine flag is exit code 2 before anything loads: no restart fixes it, so the
    restart budget is not spent on it and FAILED quotes the engine's own error line."""
    port = free_port()
    with supervised(
        engine_port=port,
        engine_cmd=sim_command(port, "--no-such-engine-flag"),
        sup_args=("--startup-restarts", "3"),
    ) as sup:
        body = sup.wait_for("FAILED", lambda b: b.get("sub_state") == "gave_up", 60)
        assert body["restarts"] == [] and len(sup.engine_pids()) == 1
        assert "usage error" in body["reason"] and "--no-such-engine-flag" in body["reason"]
        assert body["evidence"]["exit_code"] == 2
