"""Who owns the files of the local fleet behind one router port: `up-PORT.json` (the fleet file),
`up-PORT.token` (its control API's token) and `up-PORT.supervisor-token` (its supervisors'
management token), all in the state dir.

The `corral up` that holds the lock `up-PORT.lock` owns them, for its whole life. A second `up` on
that port is refused before it touches anything; files whose recorded processes still run are never
deleted or overwritten, even with the lock free; a stale set (every recorded process gone) is
replaced, with a line saying so. The other commands find a fleet's supervisor token with
`corral.state_home.supervisor_token_for`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
import psutil


class FleetInUse(Exception):
    """Another `corral up` owns the files of this port; the message says what to do."""


@dataclass(frozen=True)
class RecordedProcess:
    """A process a fleet file names, by PID and start time (so a reused PID is not mistaken for it)."""

    name: str
    pid: int
    started: float | None = None

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            return self.started is None or abs(proc.create_time() - self.started) < 1.0
        except psutil.Error:
            return False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "pid": self.pid, "started": self.started}

    @classmethod
    def of(cls, name: str, pid: int) -> RecordedProcess:
        try:
            return cls(name, pid, psutil.Process(pid).create_time())
        except psutil.Error:
            return cls(name, pid)


def recorded_processes(body: Any) -> list[RecordedProcess]:
    """The processes a fleet file names: its `corral up` and every member it started."""
    if not isinstance(body, dict):
        return []
    found: list[RecordedProcess] = []
    for entry in body.get("processes") or []:
        if isinstance(entry, dict) and isinstance(entry.get("pid"), int):
            started = entry.get("started")
            found.append(
                RecordedProcess(
                    str(entry.get("name")), entry["pid"], float(started) if started is not None else None
                )
            )
    if not found and isinstance(body.get("pid"), int):  # a fleet file from before `processes`
        found.append(RecordedProcess("up", body["pid"]))
    return found


class FleetFiles:
    def __init__(self, state_dir: Path, port: int) -> None:
        self.state_dir = state_dir
        self.port = port
        self.fleet_file = state_dir / f"up-{port}.json"
        self.control_token_file = state_dir / f"up-{port}.token"
        self.supervisor_token_file = state_dir / f"up-{port}.supervisor-token"
        self.lock_file = state_dir / f"up-{port}.lock"
        self._lock: IO[bytes] | None = None

    @property
    def files(self) -> tuple[Path, Path, Path]:
        return self.fleet_file, self.control_token_file, self.supervisor_token_file

    def claim(self) -> str | None:
        """Take the port's files for this process. Raises FleetInUse when another `up` holds them
        or a process they name still runs; returns a line to show when a stale set was replaced."""
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = self._take_lock()
        try:
            recorded = recorded_processes(_read_json(self.fleet_file))
        except OSError as exc:
            lock.close()
            raise FleetInUse(
                f"cannot read {self.fleet_file}: {exc.strerror or exc}; "
                "fix or remove it, or use another --port"
            ) from None
        alive = [p for p in recorded if p.alive()]
        if alive:
            lock.close()
            named = ", ".join(f"{p.name} pid {p.pid}" for p in alive)
            raise FleetInUse(
                f"{self.fleet_file} names processes that still run ({named}): stop them first "
                "(they may be a fleet whose corral up was killed), or use another --port"
            )
        self._lock = lock
        stale = [f for f in self.files if f.exists()]
        for path in stale:
            path.unlink(missing_ok=True)
        if not stale:
            return None
        gone = ", ".join(f"pid {p.pid}" for p in recorded) or "none recorded"
        return (
            f"replaced the stale files of an earlier fleet on port {self.port} "
            f"(its processes are gone: {gone})"
        )

    def _take_lock(self) -> IO[bytes]:
        """The port's lock, held; the file is removed on release, so a lock taken on a file that
        was removed meanwhile is taken again on the new one."""
        while True:
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            lock = os.fdopen(fd, "r+b")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                raise FleetInUse(
                    f"a local fleet on port {self.port} is already running or starting "
                    f"(its corral up holds {self.lock_file}); stop it first, or use another --port"
                ) from None
            try:
                if os.stat(self.lock_file).st_ino == os.fstat(fd).st_ino:
                    return lock
            except FileNotFoundError:
                pass
            lock.close()

    def release(self) -> None:
        """Remove the port's files and its lock; only the owner (after `claim`) does."""
        if self._lock is None:
            return
        for path in (*self.files, self.lock_file):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self._lock.close()
        self._lock = None


def _read_json(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None  # half a file from a crash: nothing in it can be alive
