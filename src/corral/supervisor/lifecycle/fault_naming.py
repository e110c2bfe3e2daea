"""A failure named by the GPU fault behind it: the words appended to a FAILED (or restarting) reason and
the evidence beside it (`gpu_fault`, and `graph_nccl_vs_stable` where another bundle served), for a start
that failed (lifecycle/startup.py) and for an engine lost while serving (lifecycle/supervisor.py); and
whether that fault rules out a restart on the same GPU (`hardware_fault`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from corral.engine.gpu_faults import is_hardware
from corral.supervisor.checks.stall import Stall
from corral.supervisor.lifecycle.engine_process import EngineProcess

Comparison = Callable[[], dict[str, Any] | None]

# what a failure after a hardware fault says instead of restarting (restarts would fail on the same GPU)
NOT_RESTARTED = "not restarted: the GPU needs a reset or the host a reboot (drain the node)"


def hardware_fault(evidence: dict[str, Any]) -> bool:
    """The failure's `gpu_fault` is the GPU's own (an Xid 79, ECC, NVLink or GSP fault, a GPU NVML lost)."""
    fault = evidence.get("gpu_fault")
    return is_hardware(fault if isinstance(fault, dict) else None)


def fault_naming(engine: EngineProcess | None, compare: Comparison) -> tuple[str, dict[str, Any]]:
    """("; <the fault in words>", its evidence) for the engine's run, or ("", {}) when it showed none."""
    fault = engine.named_fault() if engine is not None else None
    if engine is None or fault is None:
        return "", {}
    return f"; {fault.words()}", {"gpu_fault": engine.gpu_fault(), "graph_nccl_vs_stable": compare()}


def with_gpu_fault(stall: Stall, engine: EngineProcess | None, compare: Comparison) -> Stall:
    """The failure of a serving engine, named by its GPU fault when it showed one."""
    words, evidence = fault_naming(engine, compare)
    if not words:
        return stall
    return replace(stall, reason=stall.reason + words, evidence={**stall.evidence, **evidence})
