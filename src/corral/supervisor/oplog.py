"""The operation log (`--state-dir/oplog.jsonl`): every transition and operation as one fsynced JSON
line, read back when a supervisor starts to continue the epoch count and to find an engine that a
previous supervisor left running.

A left-over engine is killed, never adopted: its output, its exit status and the evidence of its
startup are gone with the old supervisor, and a new engine must never start beside one that still
holds the port and the accelerator's memory. `EngineLeftover` finds it by PID, start time and
process group, so a reused PID is never mistaken for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
import psutil


class StateDirLocked(RuntimeError):
    """Another supervisor holds this state directory."""


class OperationLog:
    """Appends fsynced JSON lines; holds an exclusive lock on the state dir while open."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / "oplog.jsonl"
        self._fh: IO[bytes] | None = None
        self._lock_fh: IO[bytes] | None = None

    def open(self) -> list[dict[str, Any]]:
        """Lock the state dir and return the records already there (a torn last line is skipped)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock_path = self.state_dir / "lock"
        self._lock_fh = lock_path.open("a+b")
        try:
            fcntl.flock(self._lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self._lock_fh.close()
            self._lock_fh = None
            raise StateDirLocked(
                f"state dir {self.state_dir} is in use by another supervisor; "
                "give each supervised engine its own --state-dir"
            ) from exc
        records = read_records(self.path)
        self._fh = self.path.open("ab")
        return records

    def append(self, record_type: str, /, **fields: Any) -> dict[str, Any]:
        """One line `{"record": record_type, "time": …, **fields}`, on disk before this returns."""
        record = {"record": record_type, "time": time.time(), **fields}
        if self._fh is None:
            return record
        self._fh.write(orjson.dumps(record, default=str) + b"\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        return record

    def close(self) -> None:
        for fh in (self._fh, self._lock_fh):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()
        self._fh = self._lock_fh = None


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records: list[dict[str, Any]] = []
    for raw in path.read_bytes().splitlines():
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue  # a line torn by a crash mid-write
        if isinstance(record, dict):
            records.append(record)
    return records


def last_epoch(records: list[dict[str, Any]]) -> int:
    return max((int(r["epoch"]) for r in records if isinstance(r.get("epoch"), int)), default=0)


@dataclass(frozen=True)
class EngineLeftover:
    """The engine a previous supervisor recorded as started and never as exited."""

    pid: int
    create_time: float
    argv: list[str]

    @classmethod
    def from_records(cls, records: list[dict[str, Any]]) -> EngineLeftover | None:
        started: dict[str, Any] | None = None
        for record in records:
            if record.get("record") == "engine_started":
                started = record
            elif record.get("record") == "engine_exited" and started:
                if record.get("pid") == started.get("pid"):
                    started = None
        if started is None:
            return None
        return cls(int(started["pid"]), float(started["create_time"]), list(started.get("argv", [])))

    def processes(self) -> list[psutil.Process]:
        """The leftover's live processes: the leader if it is the same process (PID and start time),
        and every process still in its process group that started no earlier than it."""
        found: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            leader = psutil.Process(self.pid)
            if abs(leader.create_time() - self.create_time) < 0.01:
                found.append(leader)
        for proc in psutil.process_iter(["pid", "create_time"]):
            if proc.pid == self.pid:
                continue
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getpgid(proc.pid) == self.pid and proc.create_time() >= self.create_time - 0.01:
                    found.append(proc)
        return found

    async def kill(self, grace_seconds: float) -> list[int]:
        """SIGTERM the leftovers, SIGKILL what is left after `grace_seconds`; returns the PIDs seen."""
        procs = self.processes()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGTERM)
        await _wait_gone(procs, grace_seconds)
        for proc in procs:
            if _alive(proc):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        await _wait_gone(procs, 5.0)
        return [p.pid for p in procs]


async def _wait_gone(procs: list[psutil.Process], within: float) -> None:
    """Polls: these are not our children, so there is nothing to wait() on."""
    for _ in range(max(1, int(within / 0.05))):
        if not any(_alive(p) for p in procs):
            return
        await asyncio.sleep(0.05)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
