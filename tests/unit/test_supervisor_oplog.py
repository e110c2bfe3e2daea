"""The operation log file: fsynced lines read back, a torn last line skipped, the epoch continued,
the engine a dead supervisor left behind found, and one supervisor per state dir."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil
import pytest

from corral.supervisor.oplog import EngineLeftover, OperationLog, StateDirLocked, last_epoch, read_records


def test_records_survive_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    log = OperationLog(tmp_path)
    assert log.open() == []
    log.append("transition", epoch=1, to="STARTING")
    log.append("engine_started", pid=4242, create_time=12.5, argv=["vllm", "serve"])
    log.append("transition", epoch=2, to="READY")
    log.close()
    with (tmp_path / "oplog.jsonl").open("ab") as fh:
        fh.write(b'{"record": "transition", "epo')  # a crash mid-write
    records = read_records(tmp_path / "oplog.jsonl")
    assert [r["record"] for r in records] == ["transition", "engine_started", "transition"]
    assert last_epoch(records) == 2
    leftover = EngineLeftover.from_records(records)
    assert leftover == EngineLeftover(4242, 12.5, ["vllm", "serve"])


def test_an_engine_recorded_as_exited_is_no_leftover() -> None:
    records = [
        {"record": "engine_started", "pid": 1, "create_time": 1.0},
        {"record": "engine_exited", "pid": 1, "exit_code": 0},
    ]
    assert EngineLeftover.from_records(records) is None
    records.append({"record": "engine_started", "pid": 2, "create_time": 2.0})
    assert EngineLeftover.from_records(records) == EngineLeftover(2, 2.0, [])


def test_a_reused_pid_is_not_mistaken_for_the_engine() -> None:
    other = subprocess.Popen(["sleep", "30"])  # the recorded PID, now another process
    try:
        assert EngineLeftover(other.pid, create_time=1.0, argv=[]).processes() == []
        started = psutil.Process(other.pid).create_time()
        assert [p.pid for p in EngineLeftover(other.pid, started, []).processes()] == [other.pid]
    finally:
        other.kill()
        other.wait()


def test_one_supervisor_per_state_dir(tmp_path: Path) -> None:
    first = OperationLog(tmp_path)
    first.open()
    with pytest.raises(StateDirLocked, match=str(tmp_path)):
        OperationLog(tmp_path).open()
    first.close()
    OperationLog(tmp_path).open()
