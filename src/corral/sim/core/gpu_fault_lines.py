"""What a GPU fault looks like in vLLM's log, for `corral sim --gpu-fault KIND`: the lines vLLM, torch and
NCCL print when a CUDA kernel faults, CUDA runs out of memory, an NCCL call fails or torch's NCCL
watchdog times a collective out (their texts as those projects print them), before the engine dies.

The kernel's `NVRM: Xid` line is not among them: the driver writes it to the kernel log, never to the
engine's output (a test that needs one writes it where the supervisor reads the kernel log).
"""

from __future__ import annotations

import time

ILLEGAL_MEMORY_ACCESS = "illegal-memory-access"
CUDA_OOM = "cuda-oom"
NCCL_ERROR = "nccl-error"
NCCL_TIMEOUT = "nccl-timeout"
KINDS = (ILLEGAL_MEMORY_ACCESS, CUDA_OOM, NCCL_ERROR, NCCL_TIMEOUT)

_CUDA_HINTS = (
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
    "might be incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
)


def core_lines(kind: str) -> list[str]:
    """The engine core's traceback tail for `kind` (each is logged with the core's prefix)."""
    head = ["EngineCore encountered a fatal error.", "Traceback (most recent call last):"]
    if kind == ILLEGAL_MEMORY_ACCESS:
        return [
            *head,
            '  File "vllm/v1/worker/gpu_model_runner.py", line 2311, in execute_model',
            "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
            *_CUDA_HINTS,
        ]
    if kind == CUDA_OOM:
        return [
            *head,
            '  File "vllm/v1/worker/gpu_model_runner.py", line 2311, in execute_model',
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total "
            "capacity of 79.19 GiB of which 512.00 MiB is free. Of the allocated memory 76.02 GiB is "
            "allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated.",
        ]
    if kind == NCCL_ERROR:
        return [
            *head,
            '  File "vllm/distributed/device_communicators/pynccl.py", line 140, in all_reduce',
            "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        ]
    return [*head, "RuntimeError: Executor failed."]  # NCCL_TIMEOUT: the watchdog's lines come first


def watchdog_lines(rank: int) -> list[str]:
    """torch's NCCL watchdog on a rank (its C++ log, printed without vLLM's prefix)."""
    stamp = time.strftime("%m%d %H:%M:%S") + ".000000000"
    head = f"[rank{rank}]:[E{stamp} ProcessGroupNCCL.cpp:632] [Rank {rank}]"
    work = "WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=8192, NumelOut=8192, Timeout(ms)=600000)"
    return [
        f"{head} Watchdog caught collective operation timeout: {work} ran for 600043 milliseconds before "
        "timing out.",
        f"{head} Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA "
        "kernels, subsequent GPU operations might run on corrupted/incomplete data.",
    ]
