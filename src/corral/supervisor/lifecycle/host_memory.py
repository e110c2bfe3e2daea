"""The host memory an engine may still take (a level-1 sleep's weight backup lands there): the kernel's
`MemAvailable`, capped by every memory limit above the engine's processes, i.e. the engine's cgroup and
each parent cgroup with a limit (v2 `memory.max`, v1 `memory.limit_in_bytes`), less what that cgroup
already uses. Use is counted as the kubelet counts it, the working set: usage less the inactive page
cache the kernel can reclaim, so a model's files read into the page cache do not count as taken.

A caller may name one more cgroup directory whose limit counts too (`CORRAL_MEMORY_CGROUP`:
`runbook/host_ram.py`); a limit only ever narrows what is available."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

CGROUP_FS = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as the largest page-aligned int64 (9223372036854771712)
V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class CgroupLimit:
    """One cgroup's memory limit and what its processes use now."""

    path: str
    version: int  # 1 | 2
    limit_bytes: int
    working_set_bytes: int

    @property
    def available_bytes(self) -> int:
        return max(0, self.limit_bytes - self.working_set_bytes)

    def to_json(self) -> dict[str, Any]:
        return {
            "cgroup": self.path,
            "version": self.version,
            "limit_bytes": self.limit_bytes,
            "working_set_bytes": self.working_set_bytes,
            "available_bytes": self.available_bytes,
        }


@dataclass(frozen=True)
class HostMemory:
    """What may still be allocated: the least of MemAvailable and each limit's room."""

    meminfo_available_bytes: int
    limits: tuple[CgroupLimit, ...] = ()

    @property
    def available_bytes(self) -> int:
        return min([self.meminfo_available_bytes, *(limit.available_bytes for limit in self.limits)])

    @property
    def bound_by(self) -> str:
        """Which figure is the least, in words."""
        tightest = min(self.limits, key=lambda limit: limit.available_bytes, default=None)
        if tightest is None or tightest.available_bytes >= self.meminfo_available_bytes:
            return "MemAvailable (/proc/meminfo)"
        return f"cgroup {tightest.path} (limit − working set)"

    def to_json(self) -> dict[str, Any]:
        return {
            "available_bytes": self.available_bytes,
            "bound_by": self.bound_by,
            "meminfo_available_bytes": self.meminfo_available_bytes,
            "cgroups": [limit.to_json() for limit in self.limits],
        }


def _int_file(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return None


def _stat_value(path: Path, *keys: str) -> int:
    """The first of `keys` in a `memory.stat` file (0 when none is there)."""
    with contextlib.suppress(OSError):
        found = dict(line.split()[:2] for line in path.read_text().splitlines() if len(line.split()) >= 2)
        for key in keys:
            with contextlib.suppress(KeyError, ValueError):
                return int(found[key])
    return 0


def cgroup_limit(directory: Path) -> CgroupLimit | None:
    """The limit in one cgroup directory (v2 files first, then v1); None where it sets no limit."""
    with contextlib.suppress(OSError):
        text = (directory / "memory.max").read_text().strip()
        if text == "max":
            return None
        usage = _int_file(directory / "memory.current") or 0
        inactive = _stat_value(directory / "memory.stat", "inactive_file")
        return CgroupLimit(str(directory), 2, int(text), max(0, usage - inactive))
    limit = _int_file(directory / "memory.limit_in_bytes")
    if limit is None or limit >= V1_UNLIMITED:
        return None
    usage = _int_file(directory / "memory.usage_in_bytes") or 0
    inactive = _stat_value(directory / "memory.stat", "total_inactive_file", "inactive_file")
    return CgroupLimit(str(directory), 1, limit, max(0, usage - inactive))


def process_cgroups(pid: int | str, fs: Path = CGROUP_FS) -> list[Path]:
    """The memory cgroup directories of process `pid` (`/proc/PID/cgroup`): `cgroup_directories`."""
    try:
        return cgroup_directories(Path(f"/proc/{pid}/cgroup").read_text(), fs)
    except OSError:
        return []


def cgroup_directories(proc_cgroup: str, fs: Path = CGROUP_FS) -> list[Path]:
    """From a `/proc/PID/cgroup` text, the process's memory cgroup directory, then each parent up to
    the mount: the v1 `memory` controller's line where there is one, else the v2 line (unified mount)."""
    mount, relative = fs, None
    for line in proc_cgroup.splitlines():
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            mount, relative = fs / "memory", path
            break
        if controllers == "" and relative is None and (fs / "cgroup.controllers").exists():
            relative = path
    if relative is None:
        return []
    own = mount / relative.lstrip("/")
    if not own.is_dir():  # another namespace's path: the mount is this namespace's own cgroup
        own = mount
    return [own, *(p for p in own.parents if p.is_relative_to(mount))]


def read_host_memory(pid: int | None, also: Path | None = None) -> HostMemory:
    """What the engine process `pid` (or, without one, this process) may still allocate on the host:
    MemAvailable, the limits of the process's cgroup and its parents, and the limit in `also`."""
    directories = process_cgroups(pid if pid is not None else "self")
    if also is not None:
        directories.append(also)
    limits = tuple(limit for d in directories if (limit := cgroup_limit(d)) is not None)
    return HostMemory(psutil.virtual_memory().available, limits)
