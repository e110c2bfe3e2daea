"""POSTCHECK's cleanup check: what the operation may have left (the engine it replaced and its sockets,
a CPU weight backup once awake, an orphaned preload daemon, temp files) looked for on this supervisor's
scene, named in the `leftovers` evidence, and a failure where a kind fails (`checks/leftovers.FAILS`).
The same look answers `GET /v1/leftovers` for `corral verify`."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from corral.contracts.supervisor import LeftoverReport
from corral.engine.dev_api import AdminCallFailed, EngineAdmin
from corral.engine_state import EngineState
from corral.supervisor.checks.leftovers import RssProxy, leftovers
from corral.supervisor.lifecycle.leftover_scene import EngineSnapshot, backup_size, scene_of
from corral.supervisor.runbook.template import Evidence, StepFailed

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess


async def look(
    sup: EngineAccess,
    *,
    before: EngineSnapshot | None = None,
    awake: bool = False,
    cpu_backup_bytes: float | None = None,
    rss: RssProxy | None = None,
) -> LeftoverReport:
    """The leftovers on this supervisor's scene now (the blocking look runs off the event loop)."""

    def read() -> LeftoverReport:
        scene = scene_of(
            sup.config,
            sup.engine,
            sup.preload,
            before=before,
            awake=awake,
            cpu_backup_bytes=cpu_backup_bytes,
            rss=rss,
        )
        return leftovers(scene)

    return await asyncio.to_thread(read)


async def rss_proxy(sup: EngineAccess, asleep: EngineSnapshot | None, sleep: Evidence) -> RssProxy | None:
    """A level-1 sleep's backup as host RSS: the engine's RSS while asleep against now, and the
    backup's size (`sleep`: the sleep status as the wake found it). None where the sleep kept no
    backup, or nothing was read."""
    if sleep.get("level") != 1 or asleep is None or asleep.rss_bytes is None:
        return None
    now = await EngineSnapshot.take(sup.engine)
    if now.rss_bytes is None:
        return None
    before = sleep.get("before")
    figure = before.get("gpu_weights_bytes") if isinstance(before, dict) else None
    size = backup_size(sup.engine, figure if isinstance(figure, int | float) else None)
    return RssProxy(asleep.rss_bytes, now.rss_bytes, size)


async def postcheck_leftovers(
    sup: EngineAccess,
    kind: str,
    *,
    before: EngineSnapshot | None = None,
    awake: bool = False,
    cpu_backup_bytes: float | None = None,
    rss: RssProxy | None = None,
) -> Evidence:
    """POSTCHECK's `leftovers` evidence; a find of a failing kind fails the step, naming it."""
    report = await look(sup, before=before, awake=awake, cpu_backup_bytes=cpu_backup_bytes, rss=rss)
    if report.failures:
        raise StepFailed(
            f"{kind} left {report.named(report.failures)}",
            leftovers=report.to_wire(),
        )
    return report.to_wire()


async def current_leftovers(sup: EngineAccess) -> LeftoverReport:
    """`GET /v1/leftovers`: the look now; an awake engine's own CPU backup figure where it has one."""
    awake = sup.machine.state is EngineState.READY
    backup: float | None = None
    if awake:
        try:
            backup = (await EngineAdmin(sup.session, sup.config.engine_url).figures()).cpu_backup_bytes
        except AdminCallFailed:
            backup = None
    return await look(sup, awake=awake, cpu_backup_bytes=backup)
