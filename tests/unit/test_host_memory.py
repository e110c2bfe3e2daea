"""The host memory a level-1 sleep's weight backup may take: a cgroup's limit less its working set (v2
and v1 files, "no limit" in either), the least of MemAvailable and every limit, and the PRECHECK
decision over the backup's size (one rank's weights × the ranks on this host)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.supervisor.lifecycle.host_memory import (
    CgroupLimit,
    HostMemory,
    cgroup_directories,
    cgroup_limit,
    read_host_memory,
)
from corral.supervisor.runbook.host_ram import BackupSize, check_backup_fits, memory_cgroup_setting
from corral.supervisor.runbook.template import Refused

GIB = 1 << 30


def write(directory: Path, **files: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("_", ".", 1)).write_text(text)
    return directory


def test_a_v2_limit_counts_the_working_set_not_the_reclaimable_page_cache(tmp_path: Path) -> None:
    d = write(
        tmp_path / "v2",
        memory_max=f"{8 * GIB}\n",
        memory_current=f"{5 * GIB}\n",
        memory_stat=f"anon {GIB}\ninactive_file {2 * GIB}\nactive_file 0\n",
    )
    assert cgroup_limit(d) == CgroupLimit(str(d), 2, 8 * GIB, 3 * GIB)
    assert cgroup_limit(d).available_bytes == 5 * GIB  # type: ignore[union-attr]


def test_a_v1_limit_uses_the_hierarchical_inactive_file(tmp_path: Path) -> None:
    d = write(
        tmp_path / "v1",
        memory_limit_in_bytes=f"{4 * GIB}\n",
        memory_usage_in_bytes=f"{3 * GIB}\n",
        memory_stat=f"inactive_file 1\ntotal_inactive_file {GIB}\n",
    )
    assert cgroup_limit(d) == CgroupLimit(str(d), 1, 4 * GIB, 2 * GIB)


def test_no_limit_is_none_in_either_version(tmp_path: Path) -> None:
    assert cgroup_limit(write(tmp_path / "a", memory_max="max\n", memory_current="1\n")) is None
    assert cgroup_limit(write(tmp_path / "b", memory_limit_in_bytes="9223372036854771712\n")) is None
    assert cgroup_limit(tmp_path / "missing") is None


def test_the_processs_cgroup_and_its_parents_are_read_up_to_the_mount(tmp_path: Path) -> None:
    unified = tmp_path / "v2"
    write(unified / "kubepods.slice" / "pod1" / "engine", memory_max="max\n")
    (unified / "cgroup.controllers").write_text("cpu memory\n")
    assert cgroup_directories("0::/kubepods.slice/pod1/engine\n", unified) == [
        unified / "kubepods.slice" / "pod1" / "engine",
        unified / "kubepods.slice" / "pod1",
        unified / "kubepods.slice",
        unified,
    ]
    hybrid = tmp_path / "v1"
    (hybrid / "memory" / "docker" / "abc").mkdir(parents=True)
    text = "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/docker/abc\n"
    assert cgroup_directories(text, hybrid) == [
        hybrid / "memory" / "docker" / "abc",
        hybrid / "memory" / "docker",
        hybrid / "memory",
    ]
    # a path from another cgroup namespace: this namespace's root is the process's own cgroup
    assert cgroup_directories("0::/elsewhere/not/mounted\n", unified) == [unified]
    assert cgroup_directories("4:memory:/not/here\n", hybrid) == [hybrid / "memory"]
    assert cgroup_directories("1:name=systemd:/\n", hybrid) == []


def test_one_more_cgroup_only_narrows_what_this_process_may_take(tmp_path: Path) -> None:
    """The process's own cgroups are read as well; the named one counts besides them."""
    unnarrowed = read_host_memory(None)
    d = write(tmp_path / "pod", memory_max=f"{GIB}\n", memory_current=f"{GIB // 4}\n")
    narrowed = read_host_memory(None, also=d)
    assert narrowed.limits[-1] == CgroupLimit(str(d), 2, GIB, GIB // 4)
    assert narrowed.available_bytes <= min(unnarrowed.available_bytes, GIB - GIB // 4)
    if unnarrowed.available_bytes > GIB:  # a host (and cgroups) with more room than the named one
        assert narrowed.bound_by == f"cgroup {d} (limit − working set)"


@given(
    meminfo=st.integers(0, 1 << 50),
    limits=st.lists(st.tuples(st.integers(0, 1 << 50), st.integers(0, 1 << 50)), max_size=4),
)
def test_available_is_the_least_figure_and_names_it(meminfo: int, limits: list[tuple[int, int]]) -> None:
    cgroups = tuple(CgroupLimit(f"/cg/{i}", 2, limit, used) for i, (limit, used) in enumerate(limits))
    host = HostMemory(meminfo, cgroups)
    least = min([meminfo, *(max(0, limit - used) for limit, used in limits)])
    assert host.available_bytes == least
    if least < meminfo:
        assert host.bound_by.startswith("cgroup /cg/")
    else:
        assert host.bound_by.startswith("MemAvailable")


def test_the_backup_is_every_local_ranks_share() -> None:
    size = BackupSize(3 * GIB, 4, "precheck_budget", "12.00 GiB in 4 *.safetensors ÷ (TP 4 × PP 1)")
    with pytest.raises(Refused) as refused:
        check_backup_fits(size, HostMemory(64 * GIB, (CgroupLimit("/pod", 2, 16 * GIB, 6 * GIB),)))
    message = str(refused.value)
    assert "needs 12.00 GiB of host memory (3.00 GiB/rank × 4 ranks)" in message, message
    assert "10.00 GiB is available, bound by cgroup /pod" in message and "use level 2" in message
    fits = check_backup_fits(size, HostMemory(13 * GIB))
    assert fits["outcome"] == "passed" and fits["backup"]["weights_bytes"] == 12 * GIB


def test_an_unknown_size_is_not_measured_never_passed() -> None:
    checked = check_backup_fits(BackupSize(None, 1, None, "no weight files on this host"), HostMemory(GIB))
    assert checked["outcome"] == "not_measured" and "--weights-gib" in checked["reason"]


def test_the_cgroup_setting_must_be_a_directory(tmp_path: Path) -> None:
    assert memory_cgroup_setting({}) is None
    assert memory_cgroup_setting({"CORRAL_MEMORY_CGROUP": str(tmp_path)}) == tmp_path
    with pytest.raises(Refused, match=r"CORRAL_MEMORY_CGROUP=.*is not a directory"):
        memory_cgroup_setting({"CORRAL_MEMORY_CGROUP": str(tmp_path / "nope")})
