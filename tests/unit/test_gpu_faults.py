"""GPU faults read from engine and kernel log lines (corral.engine.gpu_faults): real vLLM, PyTorch, NCCL
and driver lines each named; lookalikes (a prompt echoed in a request log, torch's hints, NCCL's
version banner, an engine that prints an Xid) not; and hostile input (huge lines, thousands of lines,
arbitrary text) bounded."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.engine import gpu_faults
from corral.engine.evidence import kinds_of
from corral.engine.gpu_faults import (
    KEPT_CHARS,
    SCANNED_CHARS,
    GpuFault,
    GpuFaultLog,
    engine_fault,
    xid_fault,
)
from corral.sim.core import gpu_fault_lines
from corral.sim.core.logs import EngineLog

# real lines as vLLM (0.8 to 0.33), torch (2.5 to 2.9) and NCCL print them
REAL = [
    (
        "(EngineCore_DP0 pid=1234) ERROR 12-02 09:43:19 [core.py:710] RuntimeError: CUDA error: an illegal "
        "memory access was encountered",
        "cuda_error",
        "an illegal memory access was encountered",
    ),
    (
        "(Worker_TP1 pid=55) torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
        "cuda_error",
        "an illegal memory access was encountered",
    ),
    ("RuntimeError: CUDA error: device-side assert triggered", "cuda_error", "device-side assert triggered"),
    (
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "cuda_error",
        "uncorrectable ECC error encountered",
    ),
    (
        "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, "
        "opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, CUDA_R_16BF, ldc, "
        "CUDA_R_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`",
        "cuda_error",
        "CUBLAS_STATUS_EXECUTION_FAILED when calling",
    ),
    (
        "Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:307 'an illegal memory access was "
        "encountered'",
        "cuda_error",
        "an illegal memory access was encountered",
    ),
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 79.11 GiB of which 1.20 GiB is free.",
        "oom",
        "Tried to allocate 2.00 GiB",
    ),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory.", "oom", ""),
    ("RuntimeError: CUDA error: out of memory", "oom", ""),
    (
        "(Worker_TP0 pid=7) ERROR 02-27 10:31:24 [multiproc_executor.py:600] "
        "torch.distributed.DistBackendError: NCCL error in: "
        "../torch/csrc/distributed/c10d/NCCLUtils.hpp:268, unhandled cuda error (run with "
        "NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
        "nccl_error",
        "unhandled cuda error",
    ),
    ("ncclUnhandledCudaError: Call to CUDA function failed.", "nccl_error", "ncclUnhandledCudaError"),
    (
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
        "nccl_error",
        "ncclSystemError",
    ),
    (
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
        "prematurely.",
        "nccl_error",
        "ncclRemoteError",
    ),
    (
        "(Worker pid=2730) ERROR 09-23 08:13:03 [pynccl_wrapper.py:417] RuntimeError: NCCL error: unhandled "
        "system error (run with NCCL_DEBUG=INFO for details)",
        "nccl_error",
        "unhandled system error",
    ),
    (
        "[rank1]:[E1218 20:27:21.433063423 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, "
        "Timeout(ms)=600000) ran for 600081 milliseconds before timing out.",
        "nccl_timeout",
        "OpType=BROADCAST",
    ),
    (
        "[rank0]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 0] Process group watchdog thread terminated with "
        "exception: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
        "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.",
        "nccl_timeout",
        "OpType=ALLREDUCE",
    ),
    (
        "[rank0]:[E1218 20:27:21.433063423 ProcessGroupNCCL.cpp:577] [Rank 0] Some NCCL operations have "
        "failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations "
        "might run on corrupted/incomplete data.",
        "nccl_error",
        "Some NCCL operations have failed or timed out",
    ),
]

XIDS = [
    (
        "6,1234,567890123,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the "
        "bus.",
        79,
        "PCI:0000:3b:00",
        "GPU has fallen off the bus",
    ),
    (
        "[ 1843.308145] NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.",
        79,
        "PCI:0000:44:00",
        "GPU has fallen off the bus",
    ),
    (
        "Feb 14 05:03:41 gpu-1 kernel: NVRM: Xid (PCI:0000:17:00): 94, pid='<unknown>', name=<unknown>, "
        "Contained: SM (0x1). RST: No, D-RST: No",
        94,
        "PCI:0000:17:00",
        "Contained: SM (0x1)",
    ),
    (
        "[Sun Dec  6 21:00:00 2026] NVRM: Xid (PCI:0000:17:00): 31, pid=12345, name=python, Ch 00000008, "
        "intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_c0000000",
        31,
        "PCI:0000:17:00",
        "MMU Fault",
    ),
]

# lines that mention the words but report no fault (or report it where an engine's error never is)
LOOKALIKES = [
    "(APIServer pid=1) INFO 12-02 09:43:19 [logger.py:39] Received request cmpl-1: prompt: 'RuntimeError: "
    "CUDA error: an illegal memory access was encountered', params: SamplingParams(n=1)",
    "(APIServer pid=1) INFO 12-02 09:43:19 [logger.py:39] Received request cmpl-2: prompt: 'ncclSystemError: "
    "x NCCL error in: y Watchdog caught collective operation timeout: z CUDA out of memory'",
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
    "might be incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    "(Worker_TP0 pid=7) INFO 12-02 09:43:19 [pynccl.py:70] vLLM is using nccl==2.21.5",
    "(Worker_TP0 pid=7) INFO 12-02 09:43:19 [utils.py:58] Found nccl from library libnccl.so.2",
    "(Worker_TP0 pid=7) INFO 12-02 09:43:19 [gpu_model_runner.py:3000] Capturing CUDA graphs (mixed "
    "prefill-decode, PIECEWISE): 100%",
    "NCCL WARN Call to bind failed: Address already in use",
    "gpu-1:7:7 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0",
    "(EngineCore_DP0 pid=1) WARNING 12-02 09:43:19 [core.py:1] The CUDA error rate is 0",
    "(EngineCore_DP0 pid=1) INFO 12-02 09:43:19 [gpu_worker.py:1] Free memory on device: 79 GiB; no CUDA "
    "out of memory expected",
    # an engine's own output that says Xid is never taken for the driver's
    "(Worker pid=1) NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
]


@pytest.mark.parametrize(("line", "kind", "detail"), REAL)
def test_each_real_fault_line_is_named(line: str, kind: str, detail: str) -> None:
    fault = engine_fault(line)
    assert fault is not None, line
    assert (fault.kind, detail in fault.detail) == (kind, True), fault
    assert fault.line == line[:KEPT_CHARS]
    assert fault.words()  # a sentence for the FAILED reason


@pytest.mark.parametrize(("record", "xid", "device", "detail"), XIDS)
def test_each_kernel_xid_record_is_named_with_its_number_and_device(
    record: str, xid: int, device: str, detail: str
) -> None:
    fault = xid_fault(record)
    assert fault is not None, record
    assert (fault.kind, fault.xid, fault.device) == ("xid", xid, device)
    assert detail in fault.detail and "pid=" not in fault.detail, fault
    assert f"Xid {xid} on {device}" in fault.words()


@pytest.mark.parametrize("line", LOOKALIKES)
def test_lookalikes_are_not_faults(line: str) -> None:
    assert engine_fault(line) is None, line


def test_an_xid_only_from_the_kernel_log_and_only_where_the_kernel_puts_it() -> None:
    assert engine_fault(XIDS[0][0]) is None  # engine output: never an Xid
    assert xid_fault("user text: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.") is None
    assert xid_fault("NVRM: GPU at PCI:0000:3b:00: GPU-1234") is None


def test_a_fault_past_the_scanned_head_of_a_huge_line_is_not_read_and_what_is_kept_is_bounded() -> None:
    assert engine_fault("x" * SCANNED_CHARS + "RuntimeError: CUDA error: an illegal memory access") is None
    huge = "RuntimeError: CUDA error: " + "an illegal memory access " * 100_000
    fault = engine_fault(huge)
    assert fault is not None and len(fault.line) == KEPT_CHARS and len(fault.detail) <= 200
    xid = xid_fault("NVRM: Xid (PCI:0000:3b:00): 79, " + "y" * 1_000_000)
    assert xid is not None and len(xid.line) <= KEPT_CHARS and len(xid.detail) <= 300


@pytest.mark.parametrize(
    "line",
    [
        "(" * 200_000,
        "(A pid=1) " * 50_000 + "RuntimeError: CUDA error: x",
        "[rank1]:" * 50_000 + "[Rank 1] Watchdog caught collective operation timeout: x",
        "ERROR 12-02 09:43:19 [" + "a" * 200_000,
        "RuntimeError: " * 50_000 + "CUDA error: x",
        "NVRM: Xid (PCI:" + "0" * 200_000,
    ],
)
def test_pathological_lines_end_without_a_fault(line: str) -> None:
    # each finishes at once: the expressions only read SCANNED_CHARS, with bounded repetitions
    assert engine_fault(line) is None
    assert xid_fault(line) is None


def test_thousands_of_fault_lines_keep_one_per_kind_and_counts() -> None:
    book = GpuFaultLog()
    for i in range(5_000):
        book.note_line(f"(Worker_TP{i % 8} pid={i}) RuntimeError: NCCL error: unhandled cuda error {i}")
        book.note_line(f"RuntimeError: CUDA error: an illegal memory access was encountered {i}")
        book.note_line("(APIServer pid=1) INFO 12-02 09:43:19 [api_server.py:1] GET /health 200")
    assert set(book.first) == {"nccl_error", "cuda_error"}
    assert book.counts == {"nccl_error": 5_000, "cuda_error": 5_000}
    body = book.to_json()
    assert body is not None and body["kind"] == "cuda_error" and body["detail"].endswith("encountered 0")
    assert body["seen"] == {"nccl_error": 5_000, "cuda_error": 5_000}


def test_the_run_is_named_by_the_most_telling_fault() -> None:
    def fault(kind: str) -> GpuFault:
        return GpuFault(kind, kind, kind, 79 if kind == "xid" else None, "PCI:0" if kind == "xid" else None)

    order = ["nccl_error", "nccl_timeout", "oom", "cuda_error", "xid"]
    for i in range(len(order)):
        seen = [fault(k) for k in order[: i + 1]]
        main = gpu_faults.primary(seen)
        assert main is not None and main.kind == order[i]
    assert gpu_faults.primary([]) is None
    assert GpuFaultLog().to_json() is None


def test_evidence_keeps_an_nccl_line_as_a_rank_failure_and_an_nccl_error() -> None:
    assert kinds_of(REAL[9][0]) == ["rank", "nccl_error"]
    assert kinds_of(REAL[0][0]) == ["cuda_error"]
    assert kinds_of(REAL[6][0]) == ["oom"]  # out of memory counts once
    assert kinds_of(REAL[14][0]) == ["rank", "nccl_timeout"]
    assert kinds_of(LOOKALIKES[0]) == []


@settings(deadline=None, max_examples=300)
@given(st.text(max_size=6000))
def test_any_text_gives_a_bounded_answer_or_none(text: str) -> None:
    for found in (engine_fault(text), xid_fault(text)):
        if found is not None:
            assert len(found.line) <= KEPT_CHARS and len(found.detail) <= 300


@settings(deadline=None, max_examples=200)
@given(
    st.sampled_from([line for line, _, _ in REAL]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200),
)
def test_a_real_fault_line_with_any_tail_is_still_named(line: str, tail: str) -> None:
    fault = engine_fault(line + tail.replace("\n", " "))
    assert fault is not None


def test_a_real_vllm_engines_whole_log_shows_no_fault() -> None:
    log = Path(__file__).resolve().parents[1] / "data" / "vllm-samples" / "engine_startup_and_shutdown.log"
    lines = log.read_text(errors="replace").splitlines()
    assert len(lines) > 100
    assert [line for line in lines if engine_fault(line) or xid_fault(line)] == []


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        ("illegal-memory-access", "cuda_error"),
        ("cuda-oom", "oom"),
        ("nccl-error", "nccl_error"),
        ("nccl-timeout", "nccl_timeout"),
    ],
)
def test_each_simulated_gpu_fault_prints_lines_the_supervisor_names(kind: str, named: str) -> None:
    out = io.StringIO()
    log = EngineLog(out)
    if kind == gpu_fault_lines.NCCL_TIMEOUT:
        for line in gpu_fault_lines.watchdog_lines(0):
            log.plain(line)
    for line in gpu_fault_lines.core_lines(kind):
        log.error("EngineCore", "core.py:1036", line)
    book = GpuFaultLog()
    for line in out.getvalue().splitlines():
        book.note_line(line)
    assert book.primary is not None and book.primary.kind == named, out.getvalue()
