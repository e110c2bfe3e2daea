"""GPU faults as the engine's log and the kernel's log say them: a CUDA error (`RuntimeError: CUDA error:
an illegal memory access was encountered`), a CUDA out-of-memory, an NCCL error (torch's `NCCL error in:`,
vLLM's `NCCL error:`, `ncclUnhandledCudaError`, ...), torch's NCCL watchdog timeout, and the driver's
`NVRM: Xid (PCI:…): 79, …` lines; each named (`GpuFault`) with what an operator runs next.

Every line is untrusted input: only its first `SCANNED_CHARS` characters are read, the text kept is cut
to `KEPT_CHARS`, and a fault is recognized only where the engine's own log puts an error, at the start of
the message after vLLM's `(proc pid=N) LEVEL time [file:line]` and torch's `[rankN]:[E… file:line]`
headers: a prompt echoed in a request log line that quotes "CUDA error:" is not a fault. An Xid comes
from the kernel's log only (`xid_fault`); an engine line that says "NVRM: Xid" is not one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SCANNED_CHARS = 4096  # a real error line's header and message fit in a few hundred characters
KEPT_CHARS = 500  # what evidence keeps of a line (as corral.engine.evidence does)

# the kinds, most telling first: the one a failed run is named by when it logged several
XID = "xid"
CUDA_ERROR = "cuda_error"
CUDA_OOM = "oom"  # the evidence kind corral.engine.evidence already counts
NCCL_TIMEOUT = "nccl_timeout"
NCCL_ERROR = "nccl_error"
KINDS = (XID, CUDA_ERROR, CUDA_OOM, NCCL_TIMEOUT, NCCL_ERROR)

# vLLM's per-process prefix, possibly nested (Ray, DP): `(Worker_TP1 pid=42) `, `(X pid=1, ip=10.0.0.1) `
_PROCESS = r"(?:\([A-Za-z][\w\- =]{0,80}? pid=\d{1,10}(?:, ip=[^)]{0,80})?\) ){0,4}"
# vLLM's logger header: `ERROR 12-02 09:43:19 [core.py:710] ` (older versions add the year or ms)
_VLLM_HEADER = r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?:[\d\-]{5,10} [\d:.]{8,15} \[[^\]]{1,120}\] )?)?"
# torch's c10d header: `[rank1]:[E1218 20:27:21.433063423 ProcessGroupNCCL.cpp:629] [Rank 1] `
_TORCH_HEADER = (
    r"(?:\[rank\d{1,6}\]:)?(?:\[[EWIF](?:\d{4} [\d:.]{8,20} (?:\d{1,10} )?| )[\w./\-]{1,120}:\d{1,6}\] )?"
    r"(?:\[(?:PG [^\]]{0,120})?Rank \d{1,6}\] )?"
)
# the exception class(es) a traceback's last line or a log message puts before the text
_EXCEPTION = r"(?:[A-Za-z_][\w.]{0,100}(?:Error|Exception): ){0,2}"
_LEAD = _PROCESS + _VLLM_HEADER + _TORCH_HEADER + _EXCEPTION

_CUDA_OOM = re.compile(
    _LEAD + r"(?:CUDA out of memory|CUDA error: out of memory)\b\.? ?(?P<text>[^\n]{0,200})"
)
_CUDA_ERROR = re.compile(
    _LEAD
    + r"(?:CUDA error: (?P<text>[^\n]{1,200})"
    + r"|CUDA driver error: (?P<driver>[^\n]{1,200})"
    # vLLM's custom all-reduce and NCCL's own CUDACHECK: `Failed: Cuda error /x.cu:12 'an illegal …'`
    + r"|Failed: Cuda error \S{1,200} '(?P<quoted>[^'\n]{1,200})')"
)
_NCCL_TIMEOUT = re.compile(
    _LEAD
    + r"(?:Process group watchdog thread terminated with exception: (?:\[Rank \d{1,6}\] )?)?"
    + r"Watchdog caught collective operation timeout: (?P<text>[^\n]{0,200})"
)
_NCCL_ERROR = re.compile(
    _LEAD
    + r"(?:NCCL error in: (?P<torch>[^\n]{1,200})"  # torch: `NCCL error in: <file>:<line>, <text>`
    + r"|NCCL error: (?P<vllm>[^\n]{1,200})"  # vLLM's pynccl wrapper: `NCCL error: <text>`
    + r"|(?P<code>nccl(?:UnhandledCudaError|SystemError|InternalError|InvalidArgument|InvalidUsage"
    + r"|RemoteError)): (?P<detail>[^\n]{0,200})"
    + r"|(?P<some>Some NCCL operations have failed or timed out)\b)"
)

# the kernel's line, wherever the kernel log puts its own prefix (/dev/kmsg `6,123,456,-;`, dmesg's
# `[ 1843.308145] `, syslog's `Dec  6 21:00:00 host kernel: `): `NVRM: Xid (PCI:0000:3b:00): 79, pid=…,
# name=…, GPU has fallen off the bus.` (older drivers omit pid and name)
_XID = re.compile(
    r"(?:\d{1,3},\d{1,20},\d{1,20},[^;]{0,20};|[^\n]{0,120}?(?:kernel: |\] ))?"
    r"NVRM: Xid \((?P<device>PCI:[0-9A-Fa-f:.]{1,20})\): (?P<xid>\d{1,4})(?:, (?P<rest>[^\n]{0,300}))?"
)
_XID_PROCESS = re.compile(r"^pid=(?:\d{1,10}|'<unknown>'), name=[^,]{0,80}, ")


@dataclass(frozen=True)
class GpuFault:
    """One fault: its kind, what it says in a few words (`detail`), the Xid number and device for a
    kernel line, and the line itself, cut to `KEPT_CHARS`."""

    kind: str
    detail: str
    line: str
    xid: int | None = None
    device: str | None = None

    def words(self) -> str:
        """The fault in a sentence for a state reason."""
        if self.kind == XID:
            if self.xid is None:  # NVML's "GPU is lost", no Xid number
                return f"GPU driver: {self.detail}" + (f" on {self.device}" if self.device else "")
            return f"GPU driver Xid {self.xid} on {self.device}: {self.detail}"
        return {
            CUDA_ERROR: "CUDA error",
            CUDA_OOM: "CUDA out of memory",
            NCCL_TIMEOUT: "NCCL collective timed out",
            NCCL_ERROR: "NCCL error",
        }[self.kind] + (f": {self.detail}" if self.detail else "")

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": self.kind, "detail": self.detail, "line": self.line}
        if self.kind == XID:
            body |= {"xid": self.xid, "device": self.device}
        return body


def _cut(text: str | None, limit: int = 200) -> str:
    return (text or "").strip().rstrip(".")[:limit]


def engine_fault(line: str) -> GpuFault | None:
    """The CUDA, out-of-memory or NCCL fault an engine log line reports, or None."""
    head = line[:SCANNED_CHARS]
    if "CUDA" not in head and "Cuda" not in head and "NCCL" not in head and "nccl" not in head:
        return None  # most lines: no regular expression runs
    kept = head[:KEPT_CHARS]
    if (oom := _CUDA_OOM.match(head)) is not None:
        return GpuFault(CUDA_OOM, _cut(oom["text"]), kept)
    if (cuda := _CUDA_ERROR.match(head)) is not None:
        return GpuFault(CUDA_ERROR, _cut(cuda["text"] or cuda["driver"] or cuda["quoted"]), kept)
    if (timeout := _NCCL_TIMEOUT.match(head)) is not None:
        return GpuFault(NCCL_TIMEOUT, _cut(timeout["text"]), kept)
    if (nccl := _NCCL_ERROR.match(head)) is not None:
        if nccl["code"]:
            detail = f"{nccl['code']}: {_cut(nccl['detail'])}"
        else:
            detail = _cut(nccl["torch"] or nccl["vllm"] or nccl["some"])
        return GpuFault(NCCL_ERROR, detail.rstrip(": "), kept)
    return None


def xid_fault(record: str) -> GpuFault | None:
    """The Xid a kernel log record reports (`NVRM: Xid (PCI:…): N, …`), or None."""
    head = record[:SCANNED_CHARS]
    if "NVRM: Xid" not in head:
        return None
    found = _XID.match(head)
    if found is None:
        return None
    rest = found["rest"] or ""
    rest = _XID_PROCESS.sub("", rest)
    return GpuFault(
        XID, _cut(rest) or "no description", head[:KEPT_CHARS].strip(), int(found["xid"]), found["device"]
    )


_PCI = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})")


def pci_key(address: str | None) -> str | None:
    """One spelling of a GPU's PCI address, for the kernel's `PCI:0000:3b:00` and NVML's
    `00000000:3B:00.0` alike (`0000:3b:00`); None when the text holds none."""
    found = _PCI.search(address or "")
    if found is None:
        return None
    return f"{int(found[1], 16):04x}:{found[2].lower()}:{found[3].lower()}"


# Xids that say the GPU itself is unusable until it is reset or the host rebooted: off the bus, double-bit
# or uncontained ECC errors, NVLink, GSP firmware; a new engine on it fails again
HARDWARE_XIDS = frozenset({48, 74, 79, 95, 119, 120})


def is_hardware(fault: dict[str, Any] | None) -> bool:
    """A fault (as `GpuFault.to_json` writes it) that restarting the engine on the same GPU cannot fix."""
    if not fault or fault.get("kind") != XID:
        return False
    xid = fault.get("xid")
    return xid in HARDWARE_XIDS if isinstance(xid, int) else "lost" in str(fault.get("detail") or "")


def primary(faults: list[GpuFault]) -> GpuFault | None:
    """The fault a run is named by: the first of the most telling kind (an Xid explains the CUDA errors
    it causes; a CUDA error, the NCCL errors and timeouts of the other ranks)."""
    for kind in KINDS:
        found = next((f for f in faults if f.kind == kind), None)
        if found is not None:
            return found
    return None


class GpuFaultLog:
    """The faults one engine run has shown: the first of each kind (later ones of a kind are mostly its
    consequences on other ranks) and a count per kind; bounded whatever the engine prints."""

    def __init__(self) -> None:
        self.first: dict[str, GpuFault] = {}
        self.counts: dict[str, int] = {}

    def note(self, fault: GpuFault | None) -> GpuFault | None:
        if fault is not None:
            self.first.setdefault(fault.kind, fault)
            self.counts[fault.kind] = self.counts.get(fault.kind, 0) + 1
        return fault

    def note_line(self, line: str) -> GpuFault | None:
        return self.note(engine_fault(line))

    @property
    def primary(self) -> GpuFault | None:
        return primary(list(self.first.values()))

    def to_json(self) -> dict[str, Any] | None:
        """The primary fault, with the count of each kind seen; None when the run showed none."""
        main = self.primary
        if main is None:
            return None
        return {**main.to_json(), "seen": dict(self.counts)}
