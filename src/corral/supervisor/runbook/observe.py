"""OBSERVE, the step that closes a runbook operation when asked (`observe_seconds` > 0): one window of
normal traffic on the engine after POSTCHECK, from its own `/metrics`, compared with the baseline read
at PRECHECK (the engine's figures since it started: its steady state so far) by the one comparison
every observer makes (`contracts.traffic.compare_windows`): errors, TTFT and ITL p99 from the
engine's histograms, its queue and KV utilization from its gauges (read every `GAUGE_EVERY_S` over the
window, one reading at PRECHECK), and the GPU memory it holds (the simulator's gauge, else NVML over
the engine's processes; on a CPU engine or without NVML, not measured and named so).

A window worse than the thresholds fails the step and with it the operation, the figures in the
error; a bundle switch then runs RECOVER (back to the bundle it came from, drained first), the other
operations leave the engine serving (there is nothing known-better to go back to). A window with too
few requests is inconclusive: recorded, never a pass, and the operation stands. An engine that is not
READY after the operation (a sleep, a partial wake) has no traffic to observe: not applicable. The
window opens when traffic comes back (routers learn of READY first), waiting at most its own length.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from corral.contracts.operations import ObservedRequest
from corral.contracts.traffic import (
    FAILED,
    GAUGE_FIGURES,
    TrafficFigures,
    WindowSummary,
    WindowThresholds,
    compare_windows,
)
from corral.contracts.window_figures import GaugeReading, GaugeWindow
from corral.engine.gauge_source import engine_window_reading
from corral.engine.load_sample import MetricsUnavailable
from corral.engine.traffic_source import ENGINE_METRICS
from corral.supervisor.lifecycle.device_memory import engine_visible_devices, read_device
from corral.supervisor.lifecycle.states import EngineState
from corral.supervisor.runbook.template import Evidence, StepFailed

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess

S = EngineState
RECOVERING_KINDS = ("switch_bundle",)  # a failed window takes the engine back to the bundle it came from
PROGRESS_EVERY_S = 10.0
TRAFFIC_POLL_S = 0.2  # how closely the window's start follows the first request back
GAUGE_EVERY_S = 0.5  # how often the window reads the engine's gauges (queue, KV, GPU memory)
GPU_MEMORY = "gpu_memory_gib"


class ObservedWindow:
    """One operation's OBSERVE: its baseline (read at PRECHECK) and its window (after POSTCHECK)."""

    def __init__(self, sup: EngineAccess, kind: str, seconds: float, limits: WindowThresholds) -> None:
        self.sup = sup
        self.kind = kind
        self.seconds = seconds
        self.limits = limits
        self.recovers = kind in RECOVERING_KINDS
        self.baseline_summary: WindowSummary | None = None
        self.baseline_note: str | None = None

    @classmethod
    def asked(cls, sup: EngineAccess, kind: str, request: ObservedRequest) -> ObservedWindow | None:
        """The OBSERVE a request asks for; None without `observe_seconds` (or with 0)."""
        if not request.observe_seconds:
            return None
        return cls(sup, kind, request.observe_seconds, request.thresholds())

    async def _read(self, gauges: GaugeWindow | None = None) -> TrafficFigures:
        """The engine's traffic figures now; its gauges, with the GPU memory it holds, go to `gauges`."""
        figures, reading = await engine_window_reading(self.sup.session, self.sup.config.engine_url)
        if gauges is not None:
            gauges.add(await self._with_device_memory(reading, gauges))
        return figures

    async def _with_device_memory(self, reading: GaugeReading, gauges: GaugeWindow) -> GaugeReading:
        """The reading with the GPU memory NVML sees held by the engine's processes, where the engine
        shows none itself (vLLM never does); why not, noted in `gauges`, where NVML cannot say."""
        if reading.gpu_memory_bytes is not None:
            return reading
        engine = self.sup.engine
        if engine is None or not engine.running:
            gauges.note(GPU_MEMORY, "no engine process runs")
            return reading
        visible = engine_visible_devices(self.sup.config.engine_env)
        device = await read_device(engine.pid, visible, also=engine.ranks.survivors())
        if device is None:
            gauges.note(GPU_MEMORY, "the engine reports no GPU memory and NVML is not available here")
            return reading
        if device.total_bytes <= 0:
            gauges.note(
                GPU_MEMORY, f"NVML attributes no GPU memory to the engine's processes {list(device.pids)}"
            )
            return reading
        return GaugeReading(reading.waiting, reading.kv_usage, float(device.total_bytes))

    async def baseline(self) -> Evidence:
        """PRECHECK's reading: the engine's figures since it started. Never raises: a baseline that
        cannot be read is named, and the window is then judged on its error ratio alone."""
        engine = self.sup.engine
        identity = engine.identity if engine is not None and engine.running else None
        if identity is None:
            self.baseline_note = "no engine process runs: no baseline"
            return {"baseline": None, "note": self.baseline_note}
        gauges = GaugeWindow()  # the gauges now: the engine's only reading of them before the change
        state = self.sup.machine.state
        if state is not S.READY:  # a sleeping engine's queue, KV and memory say nothing of its serving
            for figure in GAUGE_FIGURES:
                gauges.note(
                    figure, f"the engine was {state} at PRECHECK: its gauges then are no serving baseline"
                )
        try:
            figures = await self._read(gauges if state is S.READY else None)
        except MetricsUnavailable as exc:
            self.baseline_note = f"the engine's /metrics could not be read: {exc}"
            return {"baseline": None, "note": self.baseline_note}
        uptime = max(0.0, time.time() - identity.create_time)
        self.baseline_summary = WindowSummary.of(figures, uptime, ENGINE_METRICS, gauges)
        return {"baseline": self.baseline_summary.to_wire(), "since": "the engine's start"}

    async def observe(self) -> Evidence:
        """The window after POSTCHECK and its verdict; raises StepFailed on a failed verdict."""
        sup = self.sup
        state = sup.machine.state
        if state is not S.READY:
            why = f"the engine is {state} after the {self.kind}: no traffic reaches it to observe"
            return {"verdict": None, "not_applicable": why}
        gauges = GaugeWindow()
        try:
            first, started, waited = await self._traffic_back()
            await self._wait(started, gauges)
            last = await self._read(gauges)
        except MetricsUnavailable as exc:
            raise StepFailed(f"the observed window could not be read: {exc}") from exc
        elapsed = time.monotonic() - started
        if sup.machine.state is not S.READY:
            raise StepFailed(f"the engine left READY during the observed window: it is {sup.machine.state}")
        window = WindowSummary.of(last.minus(first), elapsed, ENGINE_METRICS, gauges)
        verdict = compare_windows(window, self.baseline_summary, self.limits)
        evidence: Evidence = {
            "waited_for_traffic_s": round(waited, 3),
            "window": window.to_wire(),
            "baseline": self.baseline_summary.to_wire() if self.baseline_summary is not None else None,
            "verdict": verdict.to_wire(),
            "thresholds": self.limits.to_wire(),
        }
        if self.baseline_note is not None:
            evidence["baseline_note"] = self.baseline_note
        sup.log(f"{self.kind}: observed {elapsed:.1f}s: {verdict.verdict}: {verdict.reason}")
        if verdict.verdict == FAILED:
            raise StepFailed(f"the observed window failed: {verdict.reason}", **evidence)
        return evidence

    async def _traffic_back(self) -> tuple[TrafficFigures, float, float]:
        """The reading that opens the window, when it was taken, and how long traffic took to come
        back: routers route to the engine again only once they learn it is READY, so the window opens
        at the last reading before the engine's first answered request (or after `seconds` of none,
        and then holds what came in its own `seconds`)."""
        began = time.monotonic()
        earlier, at = await self._read(), time.monotonic()
        while time.monotonic() - began < self.seconds:
            await asyncio.sleep(TRAFFIC_POLL_S)
            now = await self._read()
            if (now.requests, now.ttft.count) != (earlier.requests, earlier.ttft.count):
                return earlier, at, at - began
            earlier, at = now, time.monotonic()
        return earlier, at, at - began

    async def _wait(self, started: float, gauges: GaugeWindow) -> None:
        """The window's seconds from `started`, reading the gauges every `GAUGE_EVERY_S`, with a
        progress line every `PROGRESS_EVERY_S`."""
        self.sup.log(f"{self.kind}: observing {self.seconds:g}s of traffic against the PRECHECK baseline")
        said = started
        while (left := self.seconds - (time.monotonic() - started)) > 0:
            await asyncio.sleep(min(left, GAUGE_EVERY_S))
            if time.monotonic() - started < self.seconds:
                await self._read(gauges)
            if (now := time.monotonic()) - said >= PROGRESS_EVERY_S and now - started < self.seconds:
                said = now
                self.sup.log(f"{self.kind}: observing: {now - started:.0f}s of {self.seconds:g}s")
