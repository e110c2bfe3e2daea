"""The host's lock on new prefix placements (`--workers N`): one worker at a time places a prefix no engine
holds, after reading its siblings' journals, and writes its pick before the next one reads.

Why: the workers read each other's picks before each pick (`worker_journal`), but two workers that place
two new prefixes at the same instant each score before the other has written, with the same view, and
both choose the same engine. A burst of new sessions then gives one engine several prefixes more than
its peers, and an engine whose cache holds only a few more than its share thrashes: a sweep draw of 16
groups on 4 engines went to 27x the oracle's TTFT p90 with three of four concurrent placements on one
engine and not one spill before it (RESULTS.md, issue 28). Requests to an engine that holds the prefix
(almost all of them) take no lock.

A POSIX record lock (`fcntl.lockf`) on an unlinked file made before the fork: owned per process, so the
kernel drops it when a worker dies, however it dies. A worker waits at most `WAIT_SECONDS` for it (a
sibling holds it for one pick, tens of microseconds, unless it is descheduled on a loaded host; a
stopped sibling would hold it for as long as it is stopped) and then places without it, counted: a
placement a hair less even, never a stalled router.
"""

from __future__ import annotations

import fcntl
import logging
import tempfile
import time

log = logging.getLogger("corral.router.placement_lock")

WAIT_SECONDS = 0.005  # the longest a worker waits for a sibling's placement before placing without the lock
_POLL_SECONDS = 0.00005


class PlacementLock:
    def __init__(self, wait_seconds: float = WAIT_SECONDS) -> None:
        self._file = tempfile.TemporaryFile()  # unlinked at once; the workers inherit the descriptor
        self.wait_seconds = wait_seconds
        self.waited_out = 0  # placements made without the lock: a sibling held it past WAIT_SECONDS

    def acquire(self) -> bool:
        """Take the lock, waiting at most `wait_seconds`; False (and counted) when it could not."""
        fd = self._file.fileno()
        deadline = 0.0
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError:  # EAGAIN or EACCES: a sibling holds it
                now = time.monotonic()
                if not deadline:
                    deadline = now + self.wait_seconds
                elif now >= deadline:
                    self.waited_out += 1
                    if self.waited_out == 1:
                        log.warning(
                            "a sibling worker held the placement lock past %.0f ms: placing without it "
                            "(counted as placement_lock_waited_out)",
                            self.wait_seconds * 1000,
                        )
                    return False
                time.sleep(_POLL_SECONDS)

    def release(self) -> None:
        fcntl.lockf(self._file.fileno(), fcntl.LOCK_UN)
