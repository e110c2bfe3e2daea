"""`corral doctor`'s GPU-fault branches: a driver Xid, a CUDA error, a CUDA out-of-memory, an NCCL error
or an NCCL watchdog timeout, named from what the supervisor kept (the FAILED state's `gpu_fault`, the
engine run's in /v1/state, else the engine's last lines read here with corral.engine.gpu_faults), each
with the next command; and, where another bundle served before, the CUDA-graph/NCCL settings this one
changed (the runbook's "main-only graph/NCCL flags vs stable version").
"""

from __future__ import annotations

from typing import Any

from corral.engine import gpu_faults
from corral.engine.gpu_faults import GpuFault, engine_fault
from corral.fleet.checks.probe import EngineView

# the branch's last word per kind: `process-dead/<slug>` for an engine that died of it, `gpu-fault/<slug>`
# for one serving again after it
_SLUG = {
    gpu_faults.XID: "gpu-xid",
    gpu_faults.CUDA_ERROR: "cuda-error",
    gpu_faults.CUDA_OOM: "cuda-oom",
    gpu_faults.NCCL_TIMEOUT: "nccl-timeout",
    gpu_faults.NCCL_ERROR: "nccl-error",
}

_XID_LOST = frozenset({79})  # the GPU fell off the bus
_XID_ECC = frozenset({48, 63, 64, 92, 94, 95, 140})  # memory errors, page retirement, row remapping
_XID_NVLINK = frozenset({74})
_XID_FIRMWARE = frozenset({119, 120})  # GSP timeouts and errors
_XID_APPLICATION = frozenset({13, 31, 43, 45})  # a faulting kernel (the engine's own, most often)

_DRAIN_NODE = "drain the node (`kubectl drain NODE`, or take the host out of the fleet)"
_RESTART_GROUP = "keep the whole serving group out of routing and restart it as one"
_CUDA_DEBUG = (
    "to find the kernel, run one engine with CUDA_LAUNCH_BLOCKING=1 and --enforce-eager (CUDA graphs off) "
    "on the same request mix"
)


def _xid_next(xid: int | None) -> str:
    if xid in _XID_LOST:
        return (
            f"{_DRAIN_NODE}; on the host: `nvidia-smi -q` (a GPU off the bus is missing or answers ERR!) and "
            "`dmesg -T | grep -i xid`; the GPU needs a reboot (check its PCIe seating, power and "
            "temperatures) before it serves again; restarting the engine on it will not help"
        )
    if xid in _XID_ECC:
        return (
            "`nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER`; a contained error (Xid 94) needs only "
            "the engine restarted; an uncorrectable or uncontained one (48, 95) or a pending remap: "
            f"{_DRAIN_NODE} and reset the GPU (`nvidia-smi -r -i GPU`) or reboot"
        )
    if xid in _XID_NVLINK:
        return (
            f"`nvidia-smi nvlink -s` and `nvidia-smi nvlink -e` on the host; {_DRAIN_NODE} and reset the "
            "GPUs: tensor-parallel groups across that link fail until then"
        )
    if xid in _XID_FIRMWARE:
        return f"{_DRAIN_NODE}; reset the GPU or reboot; check the driver version (GSP firmware errors)"
    if xid in _XID_APPLICATION:
        return (
            "a kernel faulted on the GPU (most often the engine's own): read the CUDA error in the engine "
            f"log; the supervisor restarts it; if it recurs, {_CUDA_DEBUG}"
        )
    return f"{_DRAIN_NODE}; look the Xid up in NVIDIA's Xid catalog; on the host: `nvidia-smi -q`"


def _cuda_next(detail: str) -> str:
    low = detail.lower()
    if "ecc" in low:
        return (
            f"`nvidia-smi -q -d ECC,ROW_REMAPPER` on the host; {_DRAIN_NODE} and reset the GPU before it "
            "serves again"
        )
    if "no kernel image" in low or "ptx" in low or "driver version is insufficient" in low:
        return (
            "the image's CUDA build does not fit this GPU or driver: roll back to the known-good bundle and "
            "compare `nvidia-smi` (driver) with the image's CUDA version"
        )
    if "captur" in low or "graph" in low:
        return (
            "a CUDA graph capture failed: start the bundle with --enforce-eager to confirm, then compare its "
            "--compilation-config (cudagraph_mode, capture sizes) with the stable bundle's"
        )
    if "no cuda-capable device" in low or "busy or unavailable" in low:
        return (
            "check CUDA_VISIBLE_DEVICES and what else holds the GPU (`nvidia-smi`; exclusive compute mode "
            "admits one process)"
        )
    return (
        "the engine's CUDA context is unusable after this (the supervisor restarts it); "
        f"{_CUDA_DEBUG}; check the host's kernel log for an Xid (`dmesg -T | grep -i xid`)"
    )


def next_command(fault: dict[str, Any], logs: str) -> str:
    """What to run next for a fault as /v1/state shows it (`GpuFault.to_json`)."""
    kind = str(fault.get("kind"))
    if kind == gpu_faults.XID:
        xid = fault.get("xid")
        if xid is None and "lost" in str(fault.get("detail") or ""):  # NVML: the GPU is lost
            return _xid_next(79)
        return _xid_next(int(xid) if isinstance(xid, int) else None)
    if kind == gpu_faults.CUDA_ERROR:
        return _cuda_next(str(fault.get("detail") or ""))
    if kind == gpu_faults.CUDA_OOM:
        return (
            "lower --gpu-memory-utilization, --max-num-seqs or --max-model-len; check what else holds the "
            "GPU (`nvidia-smi --query-compute-apps=pid,used_memory --format=csv`)"
        )
    if kind == gpu_faults.NCCL_TIMEOUT:
        return (
            f"a rank stopped reaching the collective: {_RESTART_GROUP}; find the rank whose log errs first "
            "(`py-spy dump --pid RANK_PID` while one hangs); rerun with NCCL_DEBUG=INFO in the engine's "
            f"environment (a bundle's env); {logs}"
        )
    return (
        f"{_RESTART_GROUP} with NCCL_DEBUG=INFO in the engine's environment (a bundle's env) to see the "
        "failing transport; `unhandled system error`: check /dev/shm's size and the IPC_LOCK capability; "
        f"`unhandled cuda error`: the CUDA error under it; `nvidia-smi topo -m`; {logs}"
    )


def _from_lines(e: EngineView) -> dict[str, Any] | None:
    """The fault in the lines the supervisor kept (a supervisor that does not name it itself)."""
    state = e.state or {}
    lines = list((state.get("evidence") or {}).get("last_lines") or [])
    for restart in state.get("restarts") or []:
        lines += list(restart.get("last_lines") or [])
    found: list[GpuFault] = [f for line in lines if (f := engine_fault(str(line))) is not None]
    main = gpu_faults.primary(found)
    return main.to_json() if main is not None else None


def named_fault(e: EngineView) -> dict[str, Any] | None:
    """The GPU fault the engine's last run died of or showed, as the supervisor names it."""
    state = e.state or {}
    for fault in ((state.get("evidence") or {}).get("gpu_fault"), state.get("gpu_fault")):
        if isinstance(fault, dict) and fault.get("kind") in _SLUG:
            return fault
    return _from_lines(e)


def _stable_words(state: dict[str, Any], last: bool = False) -> tuple[str, str]:
    """The graph/NCCL settings that differ from the stable bundle's, for the evidence and the command
    (`last`: those of the last run that showed a GPU fault, for an engine serving again after it)."""
    compared = (state.get("evidence") or {}).get("graph_nccl_vs_stable") or state.get("graph_nccl_vs_stable")
    if last:
        compared = (state.get("last_gpu_fault") or {}).get("graph_nccl_vs_stable")
    if not isinstance(compared, dict):
        return "", ""
    stable = str(compared.get("stable_bundle"))
    changed = [c for c in compared.get("changed") or [] if isinstance(c, dict)]
    if not changed:
        return f"; graph/NCCL settings as in stable bundle {stable}", ""
    words = ", ".join(f"{c.get('name')} {c.get('here')} (stable: {c.get('stable')})" for c in changed[:8])
    return (
        f"; graph/NCCL settings changed from stable bundle {stable}: {words}",
        f"; suspect what this bundle changed: start it with the stable bundle's graph/NCCL settings, or "
        f'roll back to {stable} (POST /v1/bundle {{"name": "{stable}"}}, or corral rollout --to it)',
    )


def gpu_fault_branch(e: EngineView, died: bool) -> tuple[str, str, str] | None:
    """(branch, evidence, next command) for an engine whose last run showed a GPU fault; `died` when
    it is FAILED or restarting from it."""
    fault = named_fault(e)
    if fault is None:
        return None
    kind = str(fault["kind"])
    state = e.state or {}
    prefix = "process-dead" if died else "gpu-fault"
    seen = fault.get("seen") or {}
    counts = ", ".join(f"{k}×{n}" for k, n in seen.items()) if isinstance(seen, dict) else ""
    line = str(fault.get("line") or "").strip()[:240]
    stable, stable_next = _stable_words(state)
    lifecycle = f"{e.lifecycle}: {str(state.get('reason') or '')[:200]}; " if died else ""
    evidence = f"{lifecycle}{kind}{f' ({counts})' if counts else ''}: {line}{stable}"
    return f"{prefix}/{_SLUG[kind]}", evidence, next_command(fault, e.logs_command()) + stable_next


def recovered_fault_branch(e: EngineView) -> tuple[str, str, str] | None:
    """(branch, evidence, next command) for an engine serving again after a GPU fault its supervisor
    kept as evidence (`engine_evidence`: an Xid, a CUDA error, an NCCL error or timeout)."""
    evidence = e.evidence
    for kind in (gpu_faults.XID, gpu_faults.CUDA_ERROR, gpu_faults.NCCL_TIMEOUT, gpu_faults.NCCL_ERROR):
        entry = evidence.get(kind) or {}
        if not isinstance(entry, dict) or not int(entry.get("count") or 0):
            continue
        last = str((entry.get("last") or [""])[-1])
        read = gpu_faults.xid_fault(last) if kind == gpu_faults.XID else engine_fault(last)
        fault = read.to_json() if read is not None else {"kind": kind, "detail": "", "line": last}
        recorded = (e.state or {}).get("last_gpu_fault") or {}
        same = recorded.get("kind") == kind  # the last run with a fault showed this one
        stable, stable_next = _stable_words(e.state or {}, last=same)
        where = f" (bundle {recorded['bundle']})" if same and recorded.get("bundle") else ""
        return (
            f"gpu-fault/{_SLUG[kind]}",
            f"{kind}×{entry['count']} since the supervisor started{where}: {last.strip()[:240]}{stable}",
            next_command(fault, e.logs_command()) + stable_next,
        )
    return None


def with_stable_settings(found: tuple[str, str, str] | None, e: EngineView) -> tuple[str, str, str] | None:
    """A memory-not-released finding with the runbook's next question: the graph/NCCL settings this
    bundle changed from the stable one's (CUDA graph pools and NCCL buffers are memory a sleep may keep)."""
    if found is None:
        return None
    branch, evidence, command = found
    stable, stable_next = _stable_words(e.state or {})
    return branch, evidence + stable, command + stable_next
