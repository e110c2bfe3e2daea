"""Engine log lines that an operator must see after an operation, kept as evidence: a weight-cache
fallback to disk, a fingerprint/cache-key mismatch, out-of-memory, a worker rank dying; and two events
that are no log line alone: the preload daemon's death (`preload_exit`) and a logged KV cache size
below the memory budget (`kv_shortfall`). The supervisor records each in the
operation log and counts them in `/v1/state` (`engine_evidence`); `corral verify` and `corral doctor`
read them from there.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

# kind -> substrings (lower case); the first kind that matches a line wins
_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fallback", ("falling back to disk loading",)),
    ("fingerprint", ("fingerprint mismatch", "weightcachekey mismatch")),
    ("oom", ("out of memory", "outofmemoryerror")),
    (
        "rank",
        (
            "worker proc",
            "workerproc",
            "rank failed",
            "worker died",
            "worker failed",
            "collective operation timeout",  # torch's NCCL watchdog (corral.engine.rank_lines)
            "nccl error in:",
        ),
    ),
)
PRELOAD_EXIT = "preload_exit"
KV_SHORTFALL = "kv_shortfall"  # the logged KV cache size below the memory budget (corral.engine.kv_log)
KINDS = (*(kind for kind, _ in _MARKERS), PRELOAD_EXIT, KV_SHORTFALL)


def classify(line: str) -> str | None:
    low = line.lower()
    for kind, needles in _MARKERS:
        if any(n in low for n in needles):
            return kind
    return None


class EvidenceBook:
    """Counts of each kind and the last few lines of each, for `/v1/state`."""

    def __init__(self, keep: int = 5) -> None:
        self.counts: Counter[str] = Counter()
        self.lines: dict[str, list[str]] = {}
        self._keep = keep

    def note(self, kind: str, line: str) -> None:
        self.counts[kind] += 1
        kept = self.lines.setdefault(kind, [])
        kept.append(line[:500])
        del kept[: -self._keep]

    def to_json(self) -> dict[str, Any]:
        return {kind: {"count": self.counts[kind], "last": self.lines.get(kind, [])} for kind in self.counts}
