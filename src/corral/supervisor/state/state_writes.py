"""What a failed write to the state dir does: it is counted per file on `/metrics`, makes `/livez`
false with the reason until a write to that file succeeds again, and is logged once (then at most
once a minute while it goes on, and once when it is over) — and it never stops what the write was
recording: a full disk must not hold a state transition, a drain or a shutdown hostage."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter

Log = Callable[[str], None]


@dataclass
class _Failing:
    error: str
    since: float
    count: int = 1
    last_logged: float = 0.0


class StateWriteFailures:
    def __init__(
        self,
        counter: Counter | None,
        log: Log,
        log_every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._counter = counter  # labels: file, error
        self._log = log
        self._log_every = log_every
        self._clock = clock
        self._failing: dict[str, _Failing] = {}

    def failed(self, path: str, exc: OSError) -> None:
        """A write (or fsync) of `path` raised `exc`."""
        name = path.rsplit("/", 1)[-1]
        code = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        if self._counter is not None:
            self._counter.labels(file=name, error=code).inc()
        error = f"{exc.strerror or exc}"
        now = self._clock()
        failing = self._failing.get(path)
        if failing is None:
            self._failing[path] = _Failing(error, now, last_logged=now)
            self._log(
                f"cannot write {path}: {error} ({code}); going on without recording it, and "
                "/livez fails until a write succeeds: free space or fix the state dir"
            )
            return
        failing.count += 1
        failing.error = error
        if now - failing.last_logged >= self._log_every:
            failing.last_logged = now
            self._log(f"still failing to write {path}: {error}; {failing.count} writes failed so far")

    def succeeded(self, path: str) -> None:
        failing = self._failing.pop(path, None)
        if failing is not None:
            self._log(
                f"{path} is writable again after {failing.count} failed writes "
                f"over {self._clock() - failing.since:.0f}s"
            )

    @property
    def problem(self) -> str | None:
        """Why `/livez` is false: the files that cannot be written now, or None."""
        if not self._failing:
            return None
        return "; ".join(
            f"cannot write {path}: {f.error} ({f.count} writes failed)" for path, f in self._failing.items()
        )
