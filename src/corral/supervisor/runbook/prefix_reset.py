"""Prefix state after a level-1/2 sleep's wake, a KV release's wake, or a reload: reset the engine's
prefix cache explicitly, check that no block from before remains, and move the prefix epoch the routers
read on the state stream.

vLLM resets the prefix cache itself when it sleeps at level >= 1 (its engine core pauses the scheduler
with `clear_cache`) and when it releases the KV cache's memory (`release_kv_cache_memory` resets its
caches before it discards the `kv_cache` tag), but not on `reload_weights`, which runs in the workers;
and `POST /reset_prefix_cache` answers `{"success": false}` while running requests hold blocks. So the
reset is asked for again after the wake, and checked where the engine shows a figure: the simulator
counts its resets (`corral_sim_prefix_cache_resets_total`), and a count past the one read before the
sleep means no old block remains. vLLM shows no such figure: the check is then "not measured", never
"passed".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corral.engine.dev_api import AdminCallFailed, EngineAdmin, EngineFigures
from corral.supervisor.runbook.template import Evidence, StepFailed

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess


def prefix_cache_wiped(sleep: Mapping[str, Any]) -> bool:
    """Whether a sleep (its status, as `/v1/state` shows it) emptied the engine's prefix cache: level 1
    or 2, or a level-0 pause whose KV cache was released. Only a plain level-0 pause keeps it."""
    level = sleep.get("level")
    return (isinstance(level, int) and level >= 1) or bool(sleep.get("kv_released"))


async def reset_prefix_cache(admin: EngineAdmin) -> Evidence:
    """`POST /reset_prefix_cache`, as evidence; a refusal is recorded, not raised: the sleep's own reset
    stands, and the check that follows says whether old blocks remain."""
    try:
        success = await admin.reset_prefix_cache()
    except AdminCallFailed as exc:
        return {
            "reset": "not done",
            "why": str(exc),
            "relying_on": "the engine's own reset at sleep level >= 1 or KV release",
        }
    if success is False:
        return {
            "reset": "refused by the engine (running requests hold blocks)",
            "relying_on": "the engine's own reset at sleep level >= 1 or KV release",
        }
    return {"reset": "done" if success else "asked (the engine does not say whether it succeeded)"}


def old_blocks_gone(before: EngineFigures | None, after: EngineFigures) -> Evidence:
    """Whether any prefix block from before the sleep can remain: passed, not_measured, or StepFailed."""
    figures = {"blocks_now": after.prefix_cache_blocks, "resets_now": after.prefix_cache_resets}
    if after.prefix_cache_resets is None:
        return {
            "outcome": "not_measured",
            "reason": "the engine shows no prefix-cache figure (vLLM has none); relying on its reset",
        }
    before_resets = before.prefix_cache_resets if before is not None else None
    if before_resets is not None:
        if after.prefix_cache_resets > before_resets:
            return {
                "outcome": "passed",
                "reason": "the prefix cache was reset since before the sleep: no old block remains",
                "resets_before": before_resets,
                **figures,
            }
        raise StepFailed(
            "the engine's prefix cache was not reset since before the sleep "
            f"({after.prefix_cache_resets:.0f} resets then and now); "
            f"{after.prefix_cache_blocks} blocks may be stale",
            **figures,
        )
    if after.prefix_cache_blocks == 0:
        return {"outcome": "passed", "reason": "the prefix cache is empty", **figures}
    return {
        "outcome": "not_measured",
        "reason": "no figure from before the sleep to compare the resets with",
        **figures,
    }


async def prefix_state_after(
    sup: EngineAccess, admin: EngineAdmin, before: EngineFigures | None, why: str
) -> Evidence:
    """Reset, check, and move the prefix epoch (before READY, so the READY line carries the new one).
    Raises `StepFailed` when the engine's own figure shows old blocks may remain."""
    evidence = await reset_prefix_cache(admin)
    evidence["check"] = old_blocks_gone(before, await admin.figures())
    sup.prefix_cache.note_reset(why, evidence)
    evidence["prefix_epoch"] = sup.prefix_cache.token(sup.engine)
    return evidence
