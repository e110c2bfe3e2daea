"""What a weight reload must show beyond HTTP 200 (seed 004, "Sleep Level 2 与权重更新" VERIFY): every
rank reloaded (vLLM's per-rank `collective_rpc` results, or the rank whose worker raised), the bundle
fingerprint read again with the model files the engine read (from → to; unchanged said so), and
startup's KV-capacity check repeated. The smoke's "real completion" is `checks/readiness.py`'s."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.engine.dev_api import AdminCallFailed
from corral.engine.flags import serving_settings
from corral.engine.rank_lines import ParallelSize
from corral.engine.rpc_results import WORKER_EXCEPTION, RankResult, answered_ranks, failed_ranks
from corral.supervisor.checks.bundle import Bundle, model_files_digest, read_bundle
from corral.supervisor.lifecycle.memory_checks import budget_evidence, capacity_at_ready
from corral.supervisor.runbook.template import Evidence, StepFailed

if TYPE_CHECKING:
    from corral.engine.dev_api import EngineAdmin
    from corral.supervisor.runbook.engine_access import EngineAccess

# how long a failed call waits for the failing worker's own log line (it travels through the engine's
# output pipe, which the HTTP answer can overtake)
RANK_LINE_WAIT_S = 3.0


def _size(sup: EngineAccess) -> ParallelSize:
    return sup.engine.ranks.size if sup.engine is not None else ParallelSize()


async def _rank_lines(sup: EngineAccess, mark: int, within: float) -> tuple[str, ...]:
    """The engine's lines since `mark`, waiting up to `within` for a worker's exception line."""
    engine = sup.engine
    if engine is None:
        return ()
    deadline = time.monotonic() + within
    while True:
        lines = engine.lines_since(mark)
        if any(WORKER_EXCEPTION in line for line in lines) or time.monotonic() >= deadline:
            return lines
        await asyncio.sleep(0.05)


async def reload_every_rank(sup: EngineAccess, admin: EngineAdmin) -> Evidence:
    """`collective_rpc reload_weights`, read per rank: one result for each rank passes; a failure
    names the rank(s) whose worker raised, with its exception (StepFailed either way)."""
    size = _size(sup)
    mark = sup.engine.lines_seen if sup.engine is not None else 0
    try:
        body = await admin.reload_weights()
    except AdminCallFailed as exc:
        if size.world == 1:  # its one worker runs in the engine core: no worker line, and it is rank 0
            failed = [RankResult(0, False, None, None, None, str(exc)[:300])]
        else:
            failed = failed_ranks(await _rank_lines(sup, mark, RANK_LINE_WAIT_S), size)
        if not failed:
            raise StepFailed(
                f"reload_weights failed ({exc}); no worker logged {WORKER_EXCEPTION!r}, so the rank is "
                "not known: read the engine's log",
                ranks=[],
            ) from exc
        named = "; ".join(f"{r.label()}: {r.error or 'see its traceback'}" for r in failed)
        raise StepFailed(
            f"reload_weights failed in {named}", ranks=[r.to_json() for r in failed], engine_said=str(exc)
        ) from exc
    ranks, problem = answered_ranks(body, size)
    if problem is not None:
        raise StepFailed(f"reload_weights: {problem}", ranks=[r.to_json() for r in ranks], body=body)
    return {"ranks": [r.to_json() for r in ranks], "world_size": size.world}


def model_dir(sup: EngineAccess) -> Path | None:
    """The engine's model when it is a local directory (only then are its files fingerprinted)."""
    model = serving_settings(sup.config.engine_argv).get("model")
    path = Path(model) if isinstance(model, str) else None
    return path if path is not None and path.is_dir() else None


async def files_digest(sup: EngineAccess) -> dict[str, Any] | None:
    """The model files' digest now (the bundle's `model_files`), None when the model is no directory."""
    directory = model_dir(sup)
    return await asyncio.to_thread(model_files_digest, directory) if directory is not None else None


def _digest(bundle: Bundle | None) -> str | None:
    files = bundle.parts.get("model_files") if bundle is not None else None
    return files.get("digest") if isinstance(files, dict) else None


def files_verdict(loaded: str | None, at_call: str | None, now: str | None) -> str:
    """What a reload did to the model files, from their digests: as the engine last loaded them, just
    before `reload_weights`, and after it. ValueError when they changed during the reload."""
    if at_call != now:
        raise ValueError(
            f"the model files changed during the reload (digest {at_call} before reload_weights, {now} "
            "after it): which weights the engine holds is not known; finish writing the files, then "
            "reload again"
        )
    if now is None:
        return "not_measured: the model is not a local directory, its files are not fingerprinted"
    if loaded == now:
        return "unchanged: the same weights were reloaded (a no-op for the bundle)"
    return "changed"


async def identity_after(
    sup: EngineAccess, before: Bundle | None, files_at_call: dict[str, Any] | None
) -> Evidence:
    """Read the bundle again and say what the reload changed: the fingerprint from → to. Files that
    differ from the ones digested just before `reload_weights` changed during the reload: which
    weights the engine holds is not known (StepFailed). Files that did not change are a reload of the
    same weights, said so, and not an error: reloading the checkpoint it has is a way to repair
    weights in GPU memory, and the engine serves known weights either way."""
    precheck = sup.precheck
    artifact = precheck.artifact if precheck is not None else None
    after = await read_bundle(
        sup.session,
        sup.config.engine_url,
        sup.config.engine_argv,
        image=artifact.image if artifact is not None else None,
        hardware=artifact.hardware if artifact is not None else None,
        preload=sup.config.preload_argv,
    )
    at_call = files_at_call.get("digest") if files_at_call is not None else None
    now = _digest(after)
    try:
        files = files_verdict(_digest(before), at_call, now)
    except ValueError as exc:
        raise StepFailed(
            str(exc), files_at_call=files_at_call, files_after=after.parts.get("model_files")
        ) from exc
    sup.note_bundle(after)
    was = before.fingerprint if before is not None else None
    identity: Evidence = {
        "fingerprint": {"from": was, "to": after.fingerprint},
        "model_files": {"from": _digest(before), "to": now},
        "files": files,
    }
    identity["changed"] = was != after.fingerprint
    return identity


def kv_capacity_after(sup: EngineAccess) -> Evidence:
    """Startup's KV-capacity check again: vLLM's logged KV size against the last PRECHECK's budget.
    vLLM sizes its KV cache once, at start (a reload refills the weights, `wake_up kv_cache` maps the
    same blocks back), so the logged size is the start's, or a smaller one logged since."""
    engine = sup.engine
    if engine is None:
        return {"outcome": "not_measured", "reason": "no engine process"}
    budget = budget_evidence(sup.precheck.to_json() if sup.precheck is not None else None)
    capacity = capacity_at_ready(engine.log_figures, budget, sup.config.memory)
    sup.note_kv_capacity(capacity)
    return capacity.to_json()
