"""Durable state that fails loudly: a state dir that fills up under a running supervisor never blocks
a drain, a state transition or a shutdown; the failure is counted on /metrics, fails /livez with the
reason, and is logged once. A state dir that cannot be used at start is one line and exit 2."""

from __future__ import annotations

import signal
import stat

from tests.integration.test_supervisor_support import (
    gone,
    http_json,
    kill_leftovers,
    short_tmp_dir,
    start_supervised,
)
from tests.support.procs import CorralProcess, free_port
from tests.support.prom import sample, scrape
from tests.support.tmpfs import fill, tiny_tmpfs
from tests.support.waits import wait_until


def test_a_full_disk_under_the_oplog_never_blocks_a_drain_or_a_shutdown() -> None:
    with tiny_tmpfs("256k") as disk:
        sup = start_supervised(state_dir=disk / "state")
        pids: list[int] = []
        try:
            sup.wait_state("READY", timeout=30)
            pids = sup.engine_pids()
            assert stat.S_IMODE((disk / "state" / "oplog.jsonl").stat().st_mode) == 0o600
            fill(disk)

            status, _ = http_json(sup.url + "/v1/drain", "POST", {})
            assert status == 202
            body = sup.wait_for(
                "STOPPING/engine_stopped",
                lambda b: (b.get("state"), b.get("sub_state")) == ("STOPPING", "engine_stopped"),
                timeout=30,
            )
            assert body["drain"] is not None
            assert all(gone(pid) for pid in pids)

            status, live = sup.probe("/livez")
            assert status == 503, live
            assert live["live"] is False
            assert "oplog.jsonl" in live["live_reason"] and "No space left" in live["live_reason"]
            errors = sample(
                scrape(sup.url + "/metrics"),
                "corral_supervisor_state_write_errors_total",
                file="oplog.jsonl",
                error="ENOSPC",
            )
            assert errors is not None and errors >= 3  # every transition of the drain failed to write
            # the log line is the contract: one line tells the operator, however many writes fail
            said = [line for line in sup.proc.output().splitlines() if "cannot write" in line]
            assert len(said) == 1, said

            sup.proc.signal(signal.SIGTERM)
            assert sup.proc.wait_exit(timeout=30) == 0, sup.proc.output()[-4000:]
        finally:
            sup.proc.stop()
            kill_leftovers(pids)


def test_a_state_dir_that_cannot_be_used_is_one_line_and_exit_2() -> None:
    a_file = short_tmp_dir() / "state"
    a_file.write_text("a file where a directory should be\n")
    under_a_file = a_file / "supervise"
    proc = CorralProcess(
        ["supervise", "--port", str(free_port()), "--state-dir", str(under_a_file), "--", "/bin/true"]
    )
    code = proc.wait_exit(timeout=30)
    out = proc.output().strip()
    proc.stop()
    assert code == 2, out
    # the refusal is the contract: one line naming the value and what to do
    assert out.count("\n") == 0, out
    assert out.startswith("corral supervise: ") and str(under_a_file) in out and "Not a directory" in out


def test_a_read_only_state_dir_is_one_line_and_exit_2() -> None:
    with tiny_tmpfs("64k", read_only=True) as disk:
        proc = CorralProcess(
            ["supervise", "--port", str(free_port()), "--state-dir", str(disk / "state"), "--", "/bin/true"]
        )
        code = proc.wait_exit(timeout=30)
        out = proc.output().strip()
        proc.stop()
    assert code == 2, out
    # the refusal is the contract: one line naming the value and what to do
    assert out.count("\n") == 0 and "Read-only file system" in out, out


def test_rotation_keeps_epochs_and_the_running_engine() -> None:
    """A small --oplog-max-bytes rotates the log while the engine runs; a supervisor that then dies
    is followed by one that still finds the engine it left and continues the epochs."""
    state_dir = short_tmp_dir() / "state"
    sup = start_supervised(state_dir=state_dir, sup_args=("--oplog-max-bytes", "2048", "--oplog-keep", "2"))
    try:
        sup.wait_state("READY", timeout=30)
        wait_until(lambda: (state_dir / "oplog.jsonl.1").exists(), 10, "a rotation")
        assert not (state_dir / "oplog.jsonl.3").exists()
        assert stat.S_IMODE((state_dir / "oplog.jsonl.1").stat().st_mode) == 0o600
        current = sup.oplog()
        assert any(r["record"] == "engine_started" for r in current)  # carried into the new file
    finally:
        sup.proc.stop()
        kill_leftovers(sup.engine_pids())
