"""Engine log lines that an operator must see after an operation, kept as evidence: a weight-cache
fallback to disk, a fingerprint/cache-key mismatch, out-of-memory, a worker rank dying, a CUDA error, an
NCCL error or watchdog timeout (corral.engine.gpu_faults), a driver Xid from the kernel log; and two events
that are no log line alone: the preload daemon's death (`preload_exit`) and a logged KV cache size
below the memory budget (`kv_shortfall`). The supervisor records each in the
operation log and counts them in `/v1/state` (`engine_evidence`); `corral verify` and `corral doctor`
read them from there.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from corral.engine import gpu_faults

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
GPU_KINDS = (gpu_faults.XID, gpu_faults.CUDA_ERROR, gpu_faults.NCCL_TIMEOUT, gpu_faults.NCCL_ERROR)
KINDS = (*(kind for kind, _ in _MARKERS), *GPU_KINDS, PRELOAD_EXIT, KV_SHORTFALL)


def classify(line: str) -> str | None:
    low = line.lower()
    for kind, needles in _MARKERS:
        if any(n in low for n in needles):
            return kind
    return None


def kinds_of(line: str) -> list[str]:
    """Every kind a line is evidence of: `classify`'s, and the GPU fault it reports (an NCCL error is
    both a rank failure and an NCCL error; a CUDA out-of-memory only `oom`)."""
    found = [kind] if (kind := classify(line)) is not None else []
    fault = gpu_faults.engine_fault(line)
    if fault is not None and fault.kind not in found:
        found.append(fault.kind)
    return found


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
