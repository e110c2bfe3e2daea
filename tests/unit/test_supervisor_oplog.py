"""The operation log file: fsynced lines read back, a torn last line skipped, the epoch continued,
the engine a dead supervisor left behind found, one supervisor per state dir; a full disk reported
and never raised, 0600 files, fsync off the event loop, rotation by size."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from corral.supervisor.state.oplog import (
    EngineLeftover,
    OperationLog,
    StateDirLocked,
    last_epoch,
    read_records,
)
from corral.supervisor.state.state_writes import StateWriteFailures
from tests.support.tmpfs import fill, tiny_tmpfs
from tests.support.waits import eventually


def test_records_survive_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    oplog = OperationLog(tmp_path)
    assert oplog.open() == []
    oplog.append("transition", epoch=1, to="STARTING")
    oplog.append("engine_started", pid=4242, create_time=12.5, argv=["vllm", "serve"])
    oplog.append("transition", epoch=2, to="READY")
    oplog.close()
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


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def test_a_full_disk_is_reported_never_raised_and_the_loss_is_recorded_after() -> None:
    said: list[str] = []
    failures = StateWriteFailures(None, said.append)
    with tiny_tmpfs("64k") as disk:
        oplog = OperationLog(disk / "state", failures)
        oplog.open()
        oplog.append("transition", epoch=1, to="STARTING", padding="x" * 200)
        fill(disk)
        for epoch in range(2, 40):  # far more than the disk has room for
            oplog.append("transition", epoch=epoch, to="DRAINING", padding="x" * 200)
        assert failures.problem is not None and "No space left on device" in failures.problem
        assert len(said) == 1 and "cannot write" in said[0]  # one line, not one per write
        (disk / "filler").unlink()
        oplog.append("transition", epoch=40, to="STOPPING")
        assert failures.problem is None
        oplog.close()
        records = read_records(disk / "state" / "oplog.jsonl")
    assert records[-1]["epoch"] == 40
    lost = [r for r in records if r["record"] == "oplog_records_lost"]
    assert lost and lost[0]["count"] + len(records) - 1 >= 40  # every record is on disk or counted
    assert "writable again" in said[-1]


def test_a_quiet_log_recovers_by_itself_once_the_disk_has_room() -> None:
    failures = StateWriteFailures(None, lambda message: None)

    async def scenario(disk: Path) -> None:
        oplog = OperationLog(disk / "state", failures, retry_seconds=0.05)
        oplog.open()
        fill(disk)
        oplog.append("transition", epoch=1, to="DRAINING", padding="x" * 8192)
        assert failures.problem is not None
        (disk / "filler").unlink()
        for _ in range(100):  # no append from here on: the retry alone must clear it
            if failures.problem is None:
                break
            await asyncio.sleep(0.05)
        assert failures.problem is None
        oplog.close()

    with tiny_tmpfs("64k") as disk:
        asyncio.run(scenario(disk))
        lost = [
            r for r in read_records(disk / "state" / "oplog.jsonl") if r["record"] == "oplog_records_lost"
        ]
    assert [r["count"] for r in lost] == [1]


def test_the_log_is_0600_and_rotates_by_size_keeping_epoch_and_engine(tmp_path: Path) -> None:
    oplog = OperationLog(tmp_path, max_bytes=2048, keep=2)
    oplog.open()
    oplog.append("engine_started", pid=4242, create_time=12.5, argv=["vllm"])
    for epoch in range(1, 200):
        oplog.append("transition", epoch=epoch, to="READY", padding="x" * 50)
    oplog.close()
    names = sorted(p.name for p in tmp_path.glob("oplog.jsonl*"))
    assert names == ["oplog.jsonl", "oplog.jsonl.1", "oplog.jsonl.2"]
    for name in names:
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    assert all(len(_lines(tmp_path / n)) > 0 for n in names)
    records = OperationLog(tmp_path).open()  # what a successor reads: the current file only
    assert last_epoch(records) == 199
    assert EngineLeftover.from_records(records) == EngineLeftover(4242, 12.5, ["vllm"])


def test_fsync_runs_off_the_event_loop_and_lines_stay_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced_in: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced_in.append(threading.current_thread().name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)

    async def appends() -> None:
        oplog = OperationLog(tmp_path)
        oplog.open()
        for epoch in range(1, 101):
            oplog.append("transition", epoch=epoch)
            if epoch % 10 == 0:
                await asyncio.sleep(0.01)
        await eventually(lambda: synced_in, "an fsync of the appended lines")
        on_loop = [name for name in synced_in if name == threading.current_thread().name]
        assert synced_in and not on_loop, synced_in
        oplog.close()

    asyncio.run(appends())
    assert [r["epoch"] for r in _lines(tmp_path / "oplog.jsonl")] == list(range(1, 101))


def test_an_old_world_readable_log_becomes_0600(tmp_path: Path) -> None:
    (tmp_path / "oplog.jsonl").write_bytes(b'{"record": "transition", "epoch": 3}\n')
    (tmp_path / "oplog.jsonl").chmod(0o644)
    oplog = OperationLog(tmp_path)
    assert last_epoch(oplog.open()) == 3
    oplog.close()
    assert stat.S_IMODE((tmp_path / "oplog.jsonl").stat().st_mode) == 0o600
