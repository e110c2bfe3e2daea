"""A process known by its pid and start time, so a pid the kernel handed to someone else is not
mistaken for it: the rank watch and the leftover checks ask the same question the same way."""

from __future__ import annotations

import psutil

# psutil reads start times in clock ticks; two readings of one process differ by less than this
SAME_START_SECONDS = 0.01


def live_process(pid: int, create_time: float | None) -> psutil.Process | None:
    """The process at `pid` if it is still the one that started at `create_time` (None: any) and is
    not a zombie; None when it is gone, reaped, or the pid now belongs to another process."""
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > SAME_START_SECONDS:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return proc
