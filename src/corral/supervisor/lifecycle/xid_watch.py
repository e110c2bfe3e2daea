"""The GPU driver's Xid errors since an engine run started, from where this host lets a supervisor see
them: the kernel log (`/dev/kmsg`, readable only with CAP_SYSLOG or `kernel.dmesg_restrict=0`; or a file
a log shipper writes, named by `corral supervise run --kernel-log PATH` or CORRAL_KERNEL_LOG) and NVML's
Xid events (`nvidia-ml-py` and a driver). Neither is in an ordinary container: then `XidWatch.sources` is
empty and `unavailable` says why, and Corral names the CUDA/NCCL error the engine logged instead.

Both are opened when the run starts (so only what came after it is read) and read without blocking,
bounded (`MAX_RECORDS` records, `MAX_BYTES` bytes per read, each record cut by corral.engine.gpu_faults),
whenever the supervisor shows its state or names a failure.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Any, Protocol

from corral.engine.gpu_faults import GpuFault, pci_key, xid_fault

KMSG = Path("/dev/kmsg")
KERNEL_LOG_ENV = "CORRAL_KERNEL_LOG"  # --kernel-log's variable: a path, or "off"; unset: /dev/kmsg
MAX_RECORDS = 1000
MAX_BYTES = 256 * 1024
_LOST = "the GPU is lost (NVML_ERROR_GPU_IS_LOST)"
_KMSG_RECORD = 8192  # a /dev/kmsg read returns one record; the kernel's own limit is 1 KiB of text


class XidSource(Protocol):
    name: str

    def read_new(self) -> list[GpuFault]: ...

    def close(self) -> None: ...


class KernelMessages:
    """`/dev/kmsg`: one record per read; opened at its end, so the ring's older records are skipped."""

    name = "kmsg"

    def __init__(self, path: Path = KMSG) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        os.lseek(self._fd, 0, os.SEEK_END)

    def read_new(self) -> list[GpuFault]:
        found: list[GpuFault] = []
        for _ in range(MAX_RECORDS):
            try:
                record = os.read(self._fd, _KMSG_RECORD)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them: go on
                    continue
                raise
            if not record:
                break
            fault = xid_fault(record.decode(errors="replace"))
            if fault is not None:
                found.append(fault)
        return found

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


class KernelLogFile:
    """A text file the kernel's lines are appended to (kern.log, a shipper's file): followed from its
    end at open, from the start again if it was truncated or replaced by a new file."""

    name = "file"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("rb")
        self._file.seek(0, os.SEEK_END)
        self._partial = b""

    def read_new(self) -> list[GpuFault]:
        with contextlib.suppress(OSError):  # replaced by a new file (logrotate's create): follow the new one
            if os.stat(self.path).st_ino != os.fstat(self._file.fileno()).st_ino:
                self._file.close()
                self._file = self.path.open("rb")
                self._partial = b""
        size = os.fstat(self._file.fileno()).st_size
        if size < self._file.tell():
            self._file.seek(0)
            self._partial = b""
        data = self._partial + self._file.read(MAX_BYTES)
        lines = data.split(b"\n")
        self._partial = lines.pop()[:MAX_BYTES]  # a line still being written; bounded
        found: list[GpuFault] = []
        for raw in lines[-MAX_RECORDS:]:
            fault = xid_fault(raw.decode(errors="replace"))
            if fault is not None:
                found.append(fault)
        return found

    def close(self) -> None:
        self._file.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlXidEvents:
    """NVML's Xid critical-error events on the engine's GPUs (`visible`: CUDA_VISIBLE_DEVICES' indices or
    UUIDs; None: every GPU NVML sees), registered at open and polled with a zero timeout (no thread waits
    on them); `buses` are those GPUs' PCI addresses (corral.engine.gpu_faults.pci_key). Checked against
    nvidia-ml-py's API by reading and with a stand-in of it: no GPU here (the notes of issue 29)."""

    name = "nvml"

    def __init__(self, visible: set[str] | None = None) -> None:
        import pynvml

        self._nvml: Any = pynvml
        self._lost = False  # NVML said the GPU is lost: named once, then nothing more to read
        self.buses: set[str] = set()
        pynvml.nvmlInit()
        try:
            self._set = pynvml.nvmlEventSetCreate()
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                if (
                    visible is not None
                    and str(index) not in visible
                    and not any(uuid.startswith(v) for v in visible)
                ):
                    continue  # another engine's GPU
                if (bus := pci_key(_text(pynvml.nvmlDeviceGetPciInfo(handle).busId))) is not None:
                    self.buses.add(bus)
                with contextlib.suppress(pynvml.NVMLError):  # a device without event support
                    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._set)
        except pynvml.NVMLError:
            pynvml.nvmlShutdown()
            raise

    def read_new(self) -> list[GpuFault]:
        nvml = self._nvml
        found: list[GpuFault] = []
        for _ in range(MAX_RECORDS if not self._lost else 0):
            try:
                event = nvml.nvmlEventSetWait_v2(self._set, 0)
            except nvml.NVMLError as exc:  # NVML_ERROR_TIMEOUT: nothing pending
                if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15):
                    self._lost = True  # what a GPU off the bus answers (the kernel logs Xid 79 for it)
                    found.append(GpuFault("xid", _LOST, "NVML: GPU is lost (NVML_ERROR_GPU_IS_LOST)"))
                break
            xid = int(event.eventData)
            device = "GPU"
            with contextlib.suppress(nvml.NVMLError):
                device = "PCI:" + _text(nvml.nvmlDeviceGetPciInfo(event.device).busId)
            found.append(GpuFault("xid", "reported through NVML", f"NVML Xid {xid} on {device}", xid, device))
        return found

    def close(self) -> None:
        nvml = self._nvml
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlEventSetFree(self._set)
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _kernel_log(setting: str | None) -> tuple[XidSource | None, str | None]:
    """The kernel log source, or None and why not."""
    if setting is not None and setting.strip().lower() == "off":
        return None, "--kernel-log off"
    path = Path(setting) if setting else KMSG
    try:
        if path.is_char_device() or (path.exists() and stat.S_ISCHR(path.stat().st_mode)):
            return KernelMessages(path), None
        return KernelLogFile(path), None
    except OSError as exc:  # EPERM without CAP_SYSLOG, ENOENT in most containers
        return None, f"the kernel log {path} is not readable ({exc.strerror or exc})"


def _nvml_events(visible: set[str] | None) -> tuple[XidSource | None, str | None]:
    try:
        return NvmlXidEvents(visible), None
    except ImportError:
        return None, "NVML is not installed (nvidia-ml-py)"
    except Exception as exc:  # pynvml.NVMLError: no driver, or events not supported
        return None, f"NVML Xid events are not available ({exc})"


_ELSEWHERE_KEPT = 3


class XidWatch:
    """The Xid sources of one engine run, opened at its start; `read()` returns what came since on the
    engine's GPUs. Where NVML names those GPUs' PCI addresses, a kernel-log Xid on another GPU (another
    engine's) is counted in `elsewhere`, not returned; without NVML every Xid of the host is returned."""

    def __init__(
        self, sources: list[XidSource], unavailable: list[str], buses: set[str] | None = None
    ) -> None:
        self.sources = sources
        self.unavailable = unavailable
        self.buses = buses  # the engine's GPUs' PCI addresses, where NVML said them
        self.elsewhere = 0
        self._elsewhere_last: list[str] = []

    @classmethod
    def open(
        cls, kernel_log: str | None = None, nvml: bool = True, visible: set[str] | None = None
    ) -> XidWatch:
        """The sources of one run: `kernel_log` a path, "off", or None for /dev/kmsg where readable;
        NVML's events on the `visible` GPUs (CUDA_VISIBLE_DEVICES' entries; None: all)."""
        sources: list[XidSource] = []
        why_not: list[str] = []
        for source, problem in (_kernel_log(kernel_log), _nvml_events(visible) if nvml else (None, None)):
            if source is not None:
                sources.append(source)
            elif problem is not None:
                why_not.append(problem)
        buses = next((s.buses for s in sources if isinstance(s, NvmlXidEvents)), None)
        return cls(sources, why_not, buses or None)

    def _ours(self, fault: GpuFault) -> bool:
        key = pci_key(fault.device)
        if self.buses is None or key is None or key in self.buses:
            return True
        self.elsewhere += 1
        self._elsewhere_last = [*self._elsewhere_last, fault.line][-_ELSEWHERE_KEPT:]
        return False

    def read(self) -> list[GpuFault]:
        found: list[GpuFault] = []
        for source in list(self.sources):
            try:
                found += [f for f in source.read_new() if self._ours(f)]
            except OSError as exc:  # the file went away: stop reading it, and say so
                source.close()
                self.sources.remove(source)
                self.unavailable.append(f"{source.name} stopped: {exc}")
        return found

    def close(self) -> None:
        for source in self.sources:
            source.close()
        self.sources = []

    def to_json(self) -> dict[str, Any]:
        return {
            "sources": [s.name for s in self.sources],
            "unavailable": list(self.unavailable),
            "engine_gpus": sorted(self.buses) if self.buses is not None else None,
            "elsewhere": {"count": self.elsewhere, "last": list(self._elsewhere_last)},
        }
