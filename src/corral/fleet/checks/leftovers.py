"""`corral verify`'s `cleanup` check: per engine, what operations left behind, as its supervisor finds
it now (`GET /v1/leftovers`: old engine processes and ranks, stale sockets, a CPU weight backup once
awake, orphaned preload daemons, temp files), and for an engine without a supervisor its own CPU
backup figure while awake. Each leftover is named with its engine."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp

from corral.clients.calls import APIError
from corral.clients.supervisor import SupervisorClient
from corral.contracts.supervisor import LeftoverReport
from corral.engine.metric_names import SIM_CPU_BACKUP
from corral.fleet.checks.check import FAIL, NOT_MEASURED, PASS, WARN, Check
from corral.fleet.checks.probe import EngineView, FleetView

NAME = "cleanup"


@dataclass
class Cleanup:
    """What the fleet's engines left, gathered: failing finds, warnings, kinds not measured."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unmeasured: list[str] = field(default_factory=list)
    looked: int = 0  # engines for which something was measured

    def note_report(self, name: str, report: LeftoverReport) -> None:
        self.looked += 1
        self.failures += [f"{name}: {f.what}" for c in report.failures for f in c.found]
        self.warnings += [f"{name}: {f.what}" for c in report.warnings for f in c.found]
        self.unmeasured += [
            f"{name} {c.kind} ({c.reason})" for c in report.checks if c.verdict == "not_measured"
        ]

    def note_engine_figure(self, engine: EngineView) -> None:
        """An engine no supervisor speaks for: its own CPU backup figure, while awake."""
        backup = [s.value for s in engine.metric(SIM_CPU_BACKUP)]
        if engine.sleeping is not False or not backup:
            self.unmeasured.append(f"{engine.name} (no supervisor, no CPU backup figure while awake)")
            return
        self.looked += 1
        if sum(backup) > 0:
            held = f"{sum(backup):.0f} bytes"
            self.failures.append(
                f"{engine.name}: the engine reports a CPU weight backup of {held} while awake"
            )

    def check(self, require_measured: bool) -> Check:
        """Fails on a find that holds memory, warns on clutter; not measured where nothing could look
        (a failure with --require-measured)."""
        unmeasured = f"; not measured: {'; '.join(self.unmeasured)}" if self.unmeasured else ""
        if self.failures:
            return Check(NAME, FAIL, "left behind: " + "; ".join(self.failures + self.warnings) + unmeasured)
        if self.warnings:
            detail = "left behind (harmless until cleaned): " + "; ".join(self.warnings) + unmeasured
            return Check(NAME, WARN, detail)
        if not self.looked:
            verdict = FAIL if require_measured else NOT_MEASURED
            return Check(NAME, verdict, "nothing could look for leftovers" + unmeasured)
        return Check(NAME, PASS, f"nothing left behind on {self.looked} engines" + unmeasured)


async def _report(client: SupervisorClient) -> LeftoverReport | str:
    try:
        return await client.leftovers()
    except APIError as exc:
        if exc.status == 404:
            return f"{client.url} has no /v1/leftovers (a supervisor before issue 15)"
        return str(exc)


async def check_cleanup(view: FleetView, require_measured: bool = False) -> Check:
    """Every engine's leftovers: each supervisor asked now, concurrently; an engine without one by
    its own figure."""
    cleanup = Cleanup()
    supervised = [e for e in view.engines if e.supervisor_url is not None]
    async with aiohttp.ClientSession() as session:
        clients = [
            SupervisorClient(session, str(e.supervisor_url), view.target.token, 15.0) for e in supervised
        ]
        reports = await asyncio.gather(*(_report(c) for c in clients))
    for engine, report in zip(supervised, reports, strict=True):
        if isinstance(report, str):
            cleanup.unmeasured.append(f"{engine.name} ({report})")
        else:
            cleanup.note_report(engine.name, report)
    for engine in view.engines:
        if engine.supervisor_url is None:
            cleanup.note_engine_figure(engine)
    return cleanup.check(require_measured)
