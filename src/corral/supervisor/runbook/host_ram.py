"""PRECHECK of a level-1 sleep: the weights' backup must fit in host memory. vLLM copies every rank's
weights to host memory at level 1, so the backup is one rank's weights × the ranks on this host. One
rank's weights come from the engine where it reports them (`corral sim`'s gauges), else from the
startup PRECHECK's memory budget (the model directory's weight files ÷ TP × PP, or `--weights-gib`),
which is all a real vLLM allows. They are set against what the host may still give the engine
(`lifecycle/host_memory.py`: MemAvailable capped by its cgroups' limits). Too big refuses the sleep
before anything moved; a size nobody knows is `not_measured`, never passed.

`CORRAL_MEMORY_CGROUP=DIR` in the supervisor's environment names one more cgroup directory whose
limit counts besides the engine's own cgroup and its parents: a pod or slice cgroup that holds a limit
outside the engine's view (mounted elsewhere). Each limit only narrows the room, so the tests (and the
GPU check) point it at a directory whose files they write to make the room small."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.engine.dev_api import EngineFigures
from corral.supervisor.lifecycle.host_memory import HostMemory, read_host_memory
from corral.supervisor.lifecycle.memory_checks import ENGINE_METRICS, NOT_MEASURED, PASSED, budget_evidence
from corral.supervisor.precheck.engine_args import EngineArgError
from corral.supervisor.precheck.explain import gib
from corral.supervisor.precheck.parallel import parallel_layout
from corral.supervisor.runbook.template import Evidence, Refused

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess

BUDGET = "precheck_budget"  # the backup's size from the startup PRECHECK's memory budget
MEMORY_CGROUP_ENV = "CORRAL_MEMORY_CGROUP"


@dataclass(frozen=True)
class BackupSize:
    """The weights' backup a level-1 sleep puts in host memory: one rank's share × the local ranks."""

    per_rank_bytes: int | None
    ranks: int
    source: str | None  # engine_metrics | precheck_budget | None (unknown)
    how: str  # where the per-rank figure came from, in words

    @property
    def total_bytes(self) -> int | None:
        return None if self.per_rank_bytes is None else self.per_rank_bytes * self.ranks

    def to_json(self) -> dict[str, Any]:
        return {
            "weights_bytes": self.total_bytes,
            "weights_bytes_per_rank": self.per_rank_bytes,
            "ranks": self.ranks,
            "source": self.source,
            "how": self.how,
        }


def _local_ranks(argv: tuple[str, ...], budget: Mapping[str, Any] | None) -> int:
    world = (budget or {}).get("world_size")
    if isinstance(world, int) and world > 0:
        return world
    try:
        return parallel_layout(argv).world_size
    except EngineArgError:
        return 1


def _budget_how(budget: Mapping[str, Any]) -> str:
    lines = budget.get("lines")
    lines = lines if isinstance(lines, list) else []
    found = [str(line) for line in lines if str(line).startswith("weights/rank")]
    detail = found[0].split("=", 1)[-1].strip() if found else "the weight files"
    return f"the startup PRECHECK's memory budget: {detail}"


def backup_size(sup: EngineAccess, figures: EngineFigures) -> BackupSize:
    """The engine's own figure where it reports one, else the startup PRECHECK's budget."""
    budget = budget_evidence(sup.precheck.to_json() if sup.precheck is not None else None)
    ranks = _local_ranks(sup.config.engine_argv, budget)
    if figures.gpu_weights_bytes is not None:
        per_rank = int(figures.gpu_weights_bytes)
        return BackupSize(per_rank, ranks, ENGINE_METRICS, "the engine's memory figures")
    budgeted = (budget or {}).get("weights_bytes_per_rank")
    if isinstance(budgeted, int) and budget is not None:
        return BackupSize(budgeted, ranks, BUDGET, _budget_how(budget))
    why = (
        "the startup PRECHECK found no weight files on this host (a hub id not in the cache?) and no "
        "--weights-gib was declared"
        if budget is not None
        else "the startup PRECHECK made no memory budget"
    )
    return BackupSize(None, ranks, None, why)


def check_backup_fits(size: BackupSize, host: HostMemory) -> Evidence:
    """Refused when the backup does not fit; the evidence names both figures and where they came from."""
    evidence: Evidence = {"backup": size.to_json(), "host": host.to_json()}
    need, available = size.total_bytes, host.available_bytes
    if need is None:
        return {
            "outcome": NOT_MEASURED,
            "reason": f"not measured: the weights' size is unknown ({size.how}); declare --weights-gib",
            **evidence,
        }
    if need > available:
        ranks = f" ({gib(size.per_rank_bytes or 0)}/rank × {size.ranks} ranks)" if size.ranks > 1 else ""
        raise Refused(
            f"sleep level 1 refused: the weights' backup needs {gib(need)} of host memory{ranks}, from "
            f"{size.how}; {gib(available)} is available, bound by {host.bound_by}; use level 2 (the "
            "weights are reloaded from disk at the wake) or free host memory"
        )
    return {
        "outcome": PASSED,
        "reason": f"the weights' backup ({gib(need)}) fits in the {gib(available)} available",
        **evidence,
    }


def memory_cgroup_setting(environ: Mapping[str, str]) -> Path | None:
    """`CORRAL_MEMORY_CGROUP`: one more cgroup directory whose limit counts (None: unset)."""
    value = environ.get(MEMORY_CGROUP_ENV, "").strip()
    if not value:
        return None
    path = Path(value)
    if not path.is_dir():
        raise Refused(
            f"sleep level 1 refused: {MEMORY_CGROUP_ENV}={value} is not a directory; point it at the "
            "cgroup directory that holds a memory limit on the engine (memory.max or memory.limit_in_bytes), "
            "or unset it: the engine's own cgroup and its parents are read either way"
        )
    return path


def host_ram_for_backup(sup: EngineAccess, figures: EngineFigures) -> Evidence:
    """PRECHECK's host-memory check of a level-1 sleep (blocking reads of a few small kernel files)."""
    engine = sup.engine
    pid = engine.pid if engine is not None and engine.running else None
    cgroup = memory_cgroup_setting(os.environ)
    return check_backup_fits(backup_size(sup, figures), read_host_memory(pid, cgroup))
