"""Where GPU faults come from and what is made of them: the kernel log followed from a run's start
(corral.supervisor.lifecycle.xid_watch), the graph/NCCL settings of two bundles compared
(corral.engine.graph_nccl_flags, stable_command), and doctor's branch and next command for each fault
(corral.fleet.checks.doctor_gpu)."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from corral.bundle_spec import BundleSpec, bundle_record
from corral.contracts.records import RolloutRecord
from corral.engine.graph_nccl_flags import changed_settings, graph_nccl_settings
from corral.fleet.checks.doctor_gpu import gpu_fault_branch, next_command, recovered_fault_branch
from corral.fleet.checks.probe import EngineView
from corral.fleet.rollout.record import graph_nccl_changes
from corral.supervisor.lifecycle.fault_naming import hardware_fault
from corral.supervisor.lifecycle.stable_command import EngineCommand, compare_with_stable
from corral.supervisor.lifecycle.xid_watch import (
    KMSG,
    MAX_BYTES,
    KernelLogFile,
    KernelMessages,
    XidWatch,
)

XID_79 = (
    "Dec  6 21:00:00 gpu-1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen "
    "off the bus.\n"
)


# -- the kernel log -------------------------------------------------------------------------------


def test_the_kernel_log_file_is_read_from_the_runs_start_only(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(XID_79.replace("79,", "48,"))  # before the run: not this run's
    watch = XidWatch.open(str(log), nvml=False)
    assert [s.name for s in watch.sources] == ["file"]
    assert watch.read() == []
    with log.open("a") as f:
        f.write("Dec  6 21:00:00 gpu-1 kernel: usb 1-1: new device\n" + XID_79)
        f.write("Dec  6 21:00:01 gpu-1 kernel: NVRM: Xid (PCI:0000:3b:00): 4")  # still being written
    (fault,) = watch.read()
    assert (fault.xid, fault.device, fault.detail) == (79, "PCI:0000:3b:00", "GPU has fallen off the bus")
    with log.open("a") as f:
        f.write("5, Preemptive cleanup, due to previous errors\n")
    (later,) = watch.read()
    assert later.xid == 45
    watch.close()


def test_a_truncated_kernel_log_is_read_again_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("x" * 1000 + "\n")
    source = KernelLogFile(log)
    log.write_text(XID_79)  # rotated: shorter than where the reader was
    assert [f.xid for f in source.read_new()] == [79]
    source.close()


def test_a_huge_kernel_log_is_read_in_bounded_pieces(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    source = KernelLogFile(log)
    with log.open("a") as f:
        f.write("y" * (3 * MAX_BYTES))  # one endless line, then an Xid
        f.write("\n" + XID_79)
    reads = [source.read_new() for _ in range(5)]
    assert [f.xid for found in reads for f in found] == [79]
    source.close()


def test_no_kernel_log_says_why_and_off_turns_it_off(tmp_path: Path) -> None:
    missing = XidWatch.open(str(tmp_path / "none"), nvml=False)
    assert missing.sources == [] and "is not readable" in missing.unavailable[0]
    off = XidWatch.open("off", nvml=False)
    assert off.sources == [] and off.unavailable == ["--kernel-log off"]
    assert off.to_json() == {
        "sources": [],
        "unavailable": ["--kernel-log off"],
        "engine_gpus": None,  # not known without NVML: every Xid of the host counts
        "elsewhere": {"count": 0, "last": []},
    }


def test_a_kernel_log_that_goes_away_is_dropped_and_named(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    watch = XidWatch.open(str(log), nvml=False)

    class Gone(KernelLogFile):
        def read_new(self) -> list[Any]:
            raise OSError("gone")

    watch.sources = [Gone(log)]
    assert watch.read() == [] and watch.sources == [] and "file stopped" in watch.unavailable[-1]


def test_a_kernel_log_replaced_by_a_new_file_is_followed_from_the_new_files_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old line\n")
    source = KernelLogFile(log)
    log.rename(tmp_path / "kern.log.1")  # logrotate: moved away, a new file created in its place
    log.write_text(XID_79)
    assert [f.xid for f in source.read_new()] == [79]
    source.close()


class FakeNvml(types.ModuleType):
    """Just enough of pynvml's event API (the names and the event struct's fields as nvidia-ml-py has
    them) to drive the reader on a host without a GPU; events queued by the test."""

    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_GPU_IS_LOST = 15
    nvmlEventTypeXidCriticalError = 0x8

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.pending: list[Any] = []
        self.registered: list[tuple[int, int]] = []
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceRegisterEvents(self, handle: int, types_: int, event_set: str) -> None:
        self.registered.append((handle, types_))

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0  # never blocks the event loop
        if not self.pending:
            raise self.NVMLError(self.NVML_ERROR_TIMEOUT)
        event = self.pending.pop(0)
        if isinstance(event, Exception):
            raise event
        return event

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-{handle}aaa-bbbb".encode()

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        return types.SimpleNamespace(busId=f"00000000:{0x3B + handle:02X}:00.0".encode())

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass


def test_nvml_xid_events_are_polled_without_blocking_and_a_lost_gpu_is_named_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    watch = XidWatch.open("off")
    assert [s.name for s in watch.sources] == ["nvml"] and fake.registered == [(0, 0x8), (1, 0x8)]
    assert watch.read() == []
    fake.pending.append(types.SimpleNamespace(eventType=0x8, eventData=79, device=1))
    (xid,) = watch.read()
    assert (xid.xid, xid.device) == (79, "PCI:00000000:3C:00.0")
    fake.pending.append(fake.NVMLError(fake.NVML_ERROR_GPU_IS_LOST))
    (lost,) = watch.read()
    assert lost.xid is None and "GPU is lost" in lost.words()
    assert "drain the node" in next_command(lost.to_json(), "")
    assert watch.read() == []  # named once
    watch.close()
    assert fake.inits == 0


def test_an_xid_on_another_engines_gpu_is_counted_elsewhere_not_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = FakeNvml()  # GPU 0 at 00000000:3B:00.0, GPU 1 at 00000000:3C:00.0
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    log = tmp_path / "kern.log"
    log.write_text("")
    watch = XidWatch.open(str(log), visible={"GPU-1"})  # CUDA_VISIBLE_DEVICES=GPU-1…: the second GPU
    assert fake.registered == [(1, 0x8)] and watch.buses == {"0000:3c:00"}
    with log.open("a") as f:
        f.write(XID_79.replace("79,", "13,"))  # PCI:0000:3b:00: GPU 0, another engine's
        f.write(XID_79.replace("3b:00", "3c:00").replace("79,", "31,"))
    (ours,) = watch.read()
    assert ours.xid == 31
    assert watch.to_json()["elsewhere"]["count"] == 1 and watch.to_json()["engine_gpus"] == ["0000:3c:00"]
    watch.close()


@pytest.mark.skipif(not os.access(KMSG, os.R_OK), reason="/dev/kmsg is not readable here")
def test_dev_kmsg_opens_at_its_end_and_reads_without_blocking() -> None:
    try:
        source = KernelMessages()
    except OSError as exc:  # readable mode bits, but no CAP_SYSLOG
        pytest.skip(f"/dev/kmsg: {exc}")
    assert all(f.kind == "xid" for f in source.read_new())  # nothing blocks; what is new, if any
    source.close()


# -- graph/NCCL settings against the stable bundle --------------------------------------------------


def test_graph_and_nccl_settings_of_a_command_and_environment() -> None:
    argv = ["vllm", "serve", "/m", "-tp", "2", "--enforce-eager", "--compilation-config.cudagraph_mode=FULL"]
    argv += ["--max-model-len", "8192", "--disable-custom-all-reduce", "-cc", '{"level": 3}']
    env = {"NCCL_P2P_DISABLE": "1", "VLLM_USE_V1": "1", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "HOME": "/root"}
    assert graph_nccl_settings(argv, env) == {
        "--tensor-parallel-size": "2",
        "--enforce-eager": "on",
        "--compilation-config.cudagraph_mode": "FULL",
        "--disable-custom-all-reduce": "on",
        "--compilation-config": '{"level": 3}',
        "NCCL_P2P_DISABLE": "1",
        "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
    }


def test_changed_settings_name_each_side() -> None:
    here = {"--enforce-eager": "on", "NCCL_ALGO": "Ring"}
    stable = {"NCCL_ALGO": "Tree", "--tensor-parallel-size": "2"}
    assert [c.words() for c in changed_settings(here, stable)] == [
        "--enforce-eager on (stable: (unset))",
        "--tensor-parallel-size (unset) (stable: 2)",
        "NCCL_ALGO Ring (stable: Tree)",
    ]


def test_the_stable_command_is_the_last_other_ready_one_else_the_rollback_bundle() -> None:
    new = EngineCommand("main", ("vllm", "serve", "/m"), {"NCCL_DEBUG": "WARN"})
    old = EngineCommand("stable", ("vllm", "serve", "/m", "--enforce-eager"), {})
    rollback = EngineCommand("previous", ("vllm", "serve", "/m", "-tp", "2"), {})
    compared = compare_with_stable(new, old, rollback)
    assert compared is not None and compared["stable_bundle"] == "stable"
    assert {c["name"] for c in compared["changed"]} == {"--enforce-eager", "NCCL_DEBUG"}
    only_rollback = compare_with_stable(new, new, rollback)  # READY last on this same bundle
    assert only_rollback is not None and only_rollback["stable_bundle"] == "previous"
    assert compare_with_stable(new, None, None) is None


def test_a_secret_in_the_command_never_reaches_the_comparison() -> None:
    new = EngineCommand("main", ("vllm", "serve", "--api-key", "s3cret", "-tp", "2"), {"NCCL_X": "1"})
    old = EngineCommand("stable", ("vllm", "serve"), {"HF_TOKEN": "hf_abc"})
    assert "s3cret" not in str(compare_with_stable(new, old, None))
    assert "hf_abc" not in str(compare_with_stable(new, old, None))


# -- doctor's branches ------------------------------------------------------------------------------


def view(state: dict[str, Any]) -> EngineView:
    return EngineView("e0", "http://sup", "http://eng", state=state, health=None)


def test_a_failed_engines_named_fault_gets_its_branch_and_the_graph_nccl_changes() -> None:
    state = {
        "state": "FAILED",
        "reason": "engine exited with code 1 during startup (smoke_testing): CUDA error: an illegal memory",
        "evidence": {
            "gpu_fault": {
                "kind": "cuda_error",
                "detail": "an illegal memory access was encountered",
                "line": "RuntimeError: CUDA error: an illegal memory access was encountered",
                "seen": {"cuda_error": 1, "nccl_error": 3},
            },
            "graph_nccl_vs_stable": {
                "bundle": "main",
                "stable_bundle": "v0-33",
                "changed": [{"name": "--enforce-eager", "here": "(unset)", "stable": "on"}],
            },
        },
    }
    found = gpu_fault_branch(view(state), died=True)
    assert found is not None
    branch, evidence, command = found
    assert branch == "process-dead/cuda-error"
    assert "cuda_error×1, nccl_error×3" in evidence and "--enforce-eager (unset) (stable: on)" in evidence
    assert "CUDA_LAUNCH_BLOCKING=1" in command and "roll back to v0-33" in command


def test_an_older_supervisors_last_lines_are_read_by_doctor_itself() -> None:
    state = {
        "state": "STARTING",
        "sub_state": "restarting",
        "reason": "engine exited with code 1 during startup",
        "restarts": [
            {
                "last_lines": [
                    "[rank1]:[E1218 20:27:21.433 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught "
                    "collective operation timeout: WorkNCCL(SeqNum=1) ran for 600081 milliseconds",
                    "(Worker_TP1 pid=9) RuntimeError: NCCL error: remote process exited or there was a "
                    "network error",
                ]
            }
        ],
    }
    found = gpu_fault_branch(view(state), died=True)
    assert found is not None and found[0] == "process-dead/nccl-timeout" and "NCCL_DEBUG=INFO" in found[2]


def test_no_fault_no_branch() -> None:
    assert gpu_fault_branch(view({"state": "FAILED", "reason": "engine exited with code 1"}), True) is None
    assert recovered_fault_branch(view({"state": "READY", "engine_evidence": {"oom": {"count": 1}}})) is None


def test_an_engine_serving_again_after_an_xid_is_told_to_drain_its_node() -> None:
    state = {"state": "READY", "engine_evidence": {"xid": {"count": 2, "last": [XID_79.strip()]}}}
    found = recovered_fault_branch(view(state))
    assert found is not None
    assert found[0] == "gpu-fault/gpu-xid" and "xid×2" in found[1] and "drain the node" in found[2]


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ({"kind": "xid", "xid": 79}, "reboot"),
        ({"kind": "xid", "xid": 95}, "nvidia-smi -q -d ECC"),
        ({"kind": "xid", "xid": 74}, "nvidia-smi nvlink"),
        ({"kind": "xid", "xid": 119}, "driver version"),
        ({"kind": "xid", "xid": 13}, "CUDA_LAUNCH_BLOCKING=1"),
        ({"kind": "xid", "xid": 9999}, "Xid catalog"),
        ({"kind": "cuda_error", "detail": "uncorrectable ECC error encountered"}, "ROW_REMAPPER"),
        ({"kind": "cuda_error", "detail": "no kernel image is available for execution"}, "roll back"),
        ({"kind": "cuda_error", "detail": "operation not permitted when stream is capturing"}, "--enforce"),
        ({"kind": "cuda_error", "detail": "no CUDA-capable device is detected"}, "CUDA_VISIBLE_DEVICES"),
        ({"kind": "oom", "detail": ""}, "--gpu-memory-utilization"),
        ({"kind": "nccl_error", "detail": "unhandled system error"}, "/dev/shm"),
        ({"kind": "nccl_timeout", "detail": ""}, "py-spy dump"),
    ],
)
def test_each_fault_has_its_next_command(fault: dict[str, Any], words: str) -> None:
    assert words in next_command(fault, "corral logs --port 1")


# -- a rollout's record ------------------------------------------------------------------------------


def test_a_rollout_record_names_the_graph_nccl_settings_each_group_gets_changed() -> None:
    target = BundleSpec(
        name="v2",
        engine_args=("--compilation-config", '{"cudagraph_mode": "FULL"}', "--max-model-len", "8192"),
        env={"NCCL_P2P_DISABLE": "1", "HF_TOKEN": "hf_secret"},
    )
    before = {
        "g0": {"name": "v1", "engine_args": ["--enforce-eager"], "env": {}},
        "g1": {},  # started with its own command: its bundle is not known
        "g2": bundle_record(target),  # already on it
    }
    assert graph_nccl_changes(target, before) == {
        "g0": [
            {"name": "--compilation-config", "here": '{"cudagraph_mode": "FULL"}', "stable": "(unset)"},
            {"name": "--enforce-eager", "here": "(unset)", "stable": "on"},
            {"name": "NCCL_P2P_DISABLE", "here": "1", "stable": "(unset)"},
        ]
    }
    changes = graph_nccl_changes(target, before)
    record = RolloutRecord(kind="rollout", id="r", started=1.0, finished=2.0, graph_nccl_changes=changes)
    assert (
        RolloutRecord.model_validate_json(record.model_dump_json()).graph_nccl_changes["g0"][1]["stable"]
        == "on"
    )


@pytest.mark.parametrize(
    ("fault", "hardware"),
    [
        ({"kind": "xid", "xid": 79}, True),
        ({"kind": "xid", "xid": 95}, True),
        ({"kind": "xid", "xid": 74}, True),
        ({"kind": "xid", "xid": None, "detail": "the GPU is lost (NVML_ERROR_GPU_IS_LOST)"}, True),
        ({"kind": "xid", "xid": 13}, False),  # the engine's own kernel: a restart may well serve
        ({"kind": "xid", "xid": 94}, False),  # contained ECC error: the engine restarted is enough
        ({"kind": "cuda_error", "detail": "an illegal memory access was encountered"}, False),
        (None, False),
    ],
)
def test_only_the_gpus_own_faults_rule_out_a_restart_on_it(
    fault: dict[str, Any] | None, hardware: bool
) -> None:
    assert hardware_fault({"gpu_fault": fault} if fault is not None else {}) is hardware
