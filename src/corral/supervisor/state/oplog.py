"""The operation log (`--state-dir/oplog.jsonl`, mode 0600, rotated by size): every transition and
operation as one fsynced JSON line, read back when a supervisor starts to continue the epoch count
and to find an engine that a previous supervisor left running.

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
import psutil

from corral.supervisor.state.state_writes import StateWriteFailures

FILE_NAME = "oplog.jsonl"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_KEEP = 3


class StateDirLocked(RuntimeError):
    """Another supervisor holds this state directory."""


class OperationLog:
    """Appends JSON lines, in order, on the event loop; each is fsynced soon after by a thread of
    its own (never on the loop). Holds an exclusive lock on the state dir while open.

    A write that fails (full disk, read-only, permission) is reported to `failures` and never
    raised: the transition it records goes on. Every `retry_seconds` until one works (so `/livez`
    recovers on a quiet engine too), a line saying how many records were lost is tried again.
    Past `max_bytes` the file is rotated (`oplog.jsonl.1` … `.{keep}`), and the new file starts
    with what a successor needs from the old: the last epoch and an engine still running.
    """

    def __init__(
        self,
        state_dir: Path,
        failures: StateWriteFailures | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        keep: int = DEFAULT_KEEP,
        retry_seconds: float = 5.0,
    ) -> None:
        self.state_dir = state_dir
        self.path = state_dir / FILE_NAME
        self.failures = failures or StateWriteFailures(None, lambda message: None)
        self.max_bytes = max_bytes
        self.keep = keep
        self._fd: int | None = None
        self._lock_fh: IO[bytes] | None = None
        self._size = 0
        self._torn = False  # a failed write may have left half a line: end it before the next
        self._lost = 0
        self.retry_seconds = retry_seconds
        self._retry: asyncio.TimerHandle | None = None
        self._last_epoch = 0
        self._running_engine: dict[str, Any] | None = None
        self._syncer: ThreadPoolExecutor | None = None
        self._sync_pending = self._sync_again = False

    def open(self) -> list[dict[str, Any]]:
        """Lock the state dir and return the records already there (a torn last line is skipped).
        Raises StateDirLocked, or OSError when the state dir cannot be used at all."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(self.state_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._lock_fh = os.fdopen(lock_fd, "r+b")
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
        self._last_epoch = last_epoch(records)
        leftover = _running_engine(records)
        self._running_engine = leftover
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.fchmod(self._fd, 0o600)  # a log from an older version may have been world-readable
        self._size = os.fstat(self._fd).st_size
        self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="oplog-fsync")
        return records

    def append(self, record_type: str, /, **fields: Any) -> dict[str, Any]:
        """One line `{"record": record_type, "time": …, **fields}`, written before this returns
        (fsynced soon after); a write that fails is reported, never raised."""
        record = {"record": record_type, "time": time.time(), **fields}
        self._remember(record)
        if self._fd is None:
            return record
        line = orjson.dumps(record, default=str) + b"\n"
        if self._lost and self._write(self._lost_line()):
            self._lost = 0
        if not self._write(line):
            self._lost += 1
            self._retry_later()
            return record
        if self._size >= self.max_bytes:
            self._rotate()
        self._sync_soon()
        return record

    def _remember(self, record: dict[str, Any]) -> None:
        epoch = record.get("epoch")
        if isinstance(epoch, int):
            self._last_epoch = max(self._last_epoch, epoch)
        if record["record"] == "engine_started":
            self._running_engine = record
        elif record["record"] == "engine_exited" and self._running_engine is not None:
            if record.get("pid") == self._running_engine.get("pid"):
                self._running_engine = None

    def _retry_later(self) -> None:
        if self._retry is not None:
            return
        try:
            self._retry = asyncio.get_running_loop().call_later(self.retry_seconds, self._retry_lost_line)
        except RuntimeError:  # no loop: the next append tries again
            pass

    def _retry_lost_line(self) -> None:
        self._retry = None
        if self._fd is None or not self._lost:
            return
        if self._write(self._lost_line()):
            self._lost = 0
            self._sync_soon()
        else:
            self._retry_later()

    def _lost_line(self) -> bytes:
        lost = {"record": "oplog_records_lost", "time": time.time(), "count": self._lost}
        return orjson.dumps(lost) + b"\n"

    def _write(self, data: bytes) -> bool:
        assert self._fd is not None
        if self._torn:
            data = b"\n" + data
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                self._size += written
                view = view[written:]
        except OSError as exc:
            self._torn = True
            self.failures.failed(str(self.path), exc)
            return False
        self._torn = False
        self.failures.succeeded(str(self.path))
        return True

    def _sync_soon(self) -> None:
        """One fsync at a time in the syncer thread; appends meanwhile are covered by one more."""
        if self._fd is None or self._syncer is None:
            return
        if self._sync_pending:
            self._sync_again = True
            return
        try:
            fd = os.dup(self._fd)
        except OSError as exc:
            self.failures.failed(str(self.path), exc)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a tool reading and writing the log): sync here
            self._report_sync(_fsync_copy(fd))
            return
        self._sync_pending = True
        future = loop.run_in_executor(self._syncer, _fsync_copy, fd)
        future.add_done_callback(self._synced)

    def _synced(self, future: asyncio.Future[OSError | None]) -> None:
        self._sync_pending = False
        if not future.cancelled():
            self._report_sync(future.result())
        if self._sync_again:
            self._sync_again = False
            self._sync_soon()

    def _report_sync(self, error: OSError | None) -> None:
        if error is not None:
            self.failures.failed(str(self.path), error)

    def _rotate(self) -> None:
        """oplog.jsonl -> .1 -> .2 …, the oldest beyond `keep` dropped; a failure to rotate is
        reported and the current file goes on growing until the next try."""
        assert self._fd is not None
        self._size = 0  # also when rotating fails: try again after another max_bytes
        try:
            for i in range(self.keep, 0, -1):
                older = self.path.with_name(f"{FILE_NAME}.{i - 1}" if i > 1 else FILE_NAME)
                if older.exists():
                    os.replace(older, self.path.with_name(f"{FILE_NAME}.{i}"))
            if self.keep == 0:
                self.path.unlink()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            self.failures.failed(str(self.path), exc)
            return
        old, self._fd, self._torn = self._fd, fd, False
        if self._syncer is not None:
            self._syncer.submit(_fsync_copy, old)  # the old file's last lines, then its fd is closed
        else:
            os.close(old)
        carried = {"record": "oplog_rotated", "time": time.time(), "epoch": self._last_epoch}
        self._write(orjson.dumps(carried) + b"\n")
        if self._running_engine is not None:  # so a successor still finds (and kills) it
            self._write(orjson.dumps(self._running_engine, default=str) + b"\n")

    def close(self) -> None:
        """The last lines fsynced (a failure reported), then the file and the lock let go."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._fd is not None:
            self._report_sync(_fsync_copy(self._fd))
            self._fd = None
        if self._syncer is not None:
            self._syncer.shutdown(wait=False)
            self._syncer = None
        if self._lock_fh is not None:
            with contextlib.suppress(OSError):
                self._lock_fh.close()
            self._lock_fh = None


def _fsync_copy(fd: int) -> OSError | None:
    """fsync then close `fd` (a dup of the log's, so rotation may close the original meanwhile)."""
    try:
        os.fsync(fd)
    except OSError as exc:
        return exc
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return None


def _running_engine(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    started: dict[str, Any] | None = None
    for record in records:
        if record.get("record") == "engine_started":
            started = record
        elif record.get("record") == "engine_exited" and started:
            if record.get("pid") == started.get("pid"):
                started = None
    return started


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
        started = _running_engine(records)
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
