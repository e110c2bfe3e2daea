"""Who owns a local fleet's files: one `corral up` per port (the lock), files whose recorded processes
run are never removed, a stale set is replaced with a note, and the other commands find the fleet's
supervisor token through its fleet file."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import psutil
import pytest

from corral.fleet.checks.probe import FleetTarget
from corral.fleet.local.ownership import FleetFiles, FleetInUse, RecordedProcess
from corral.fleet.rollout.cli_run import FleetRef
from corral.state_home import supervisor_token_for


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _write_fleet(files: FleetFiles, processes: list[RecordedProcess], **extra: object) -> None:
    files.state_dir.mkdir(parents=True, exist_ok=True)
    body = {"router": "http://127.0.0.1:1", "processes": [p.to_json() for p in processes], **extra}
    files.fleet_file.write_bytes(orjson.dumps(body))
    files.control_token_file.write_text("control\n")


def test_one_up_per_port_and_only_the_owner_removes_the_files(tmp_path: Path) -> None:
    first = FleetFiles(tmp_path, 8000)
    assert first.claim() is None
    _write_fleet(first, [RecordedProcess.of("up", os.getpid())])
    second = FleetFiles(tmp_path, 8000)
    with pytest.raises(FleetInUse, match="already running or starting"):
        second.claim()
    second.release()  # never claimed: removes nothing
    assert first.fleet_file.exists() and first.control_token_file.exists()
    first.release()
    assert not first.fleet_file.exists() and not first.control_token_file.exists()
    assert FleetFiles(tmp_path, 8000).claim() is None  # the lock is free again


def test_files_whose_processes_run_are_never_touched_even_with_the_lock_free(tmp_path: Path) -> None:
    files = FleetFiles(tmp_path, 8001)
    _write_fleet(files, [RecordedProcess("up", _dead_pid()), RecordedProcess.of("engine-0", os.getpid())])
    before = files.fleet_file.read_bytes()
    with pytest.raises(FleetInUse, match=f"engine-0 pid {os.getpid()}"):
        files.claim()
    assert files.fleet_file.read_bytes() == before and files.control_token_file.exists()


def test_a_stale_set_is_replaced_with_a_note_and_a_reused_pid_is_not_alive(tmp_path: Path) -> None:
    files = FleetFiles(tmp_path, 8002)
    started = psutil.Process(os.getpid()).create_time()
    reused = RecordedProcess("router", os.getpid(), started - 3600)  # same PID, another process
    dead = _dead_pid()
    _write_fleet(files, [RecordedProcess("up", dead), reused])
    note = files.claim()
    assert note is not None and "stale" in note and f"pid {dead}" in note
    assert not files.fleet_file.exists() and not files.control_token_file.exists()
    files.release()


def test_the_cli_finds_the_fleets_supervisor_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    files = FleetFiles(tmp_path / "corral", 8003)
    files.claim()
    files.supervisor_token_file.write_text("s3cret\n")
    _write_fleet(
        files,
        [],
        control="http://127.0.0.1:2",
        token_file=str(files.control_token_file),
        supervisor_token_file=str(files.supervisor_token_file),
        engines=[{"name": "engine-0", "supervisor": "http://127.0.0.1:9001"}],
    )
    assert supervisor_token_for("http://127.0.0.1:9001/", files.state_dir) == "s3cret"
    assert supervisor_token_for("http://127.0.0.1:9002", files.state_dir) is None
    assert FleetTarget.resolve(8003, None, (), None).token == "s3cret"  # status, verify, doctor
    assert FleetTarget.resolve(8003, None, (), "given").token == "given"
    ref = FleetRef.load(None, 8003)  # rollout, rollback
    assert (ref.control_token, ref.supervisor_token) == ("control", "s3cret")
    files.release()
