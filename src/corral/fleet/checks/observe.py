"""`corral verify --observe-seconds`: one window of the fleet's normal traffic, read from the router's
per-endpoint figures (`/v1/fleet` `traffic`: errors, TTFT, ITL) at its start and end and from each
engine's own gauges (queue, KV utilization; `engine.gauge_source`) every `GAUGE_EVERY` seconds, judged
with `compare_windows` against the last change record's steady window, and each endpoint against the
fleet's own window (per engine), so one bad engine hidden in a big fleet is named."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pydantic import ValidationError

from corral.clients.access import RouterAdminError
from corral.clients.router import RouterAdminClient
from corral.contracts.records import LatencyRecord, RequestFailures
from corral.contracts.router import FleetEndpoint, RouterFleet
from corral.contracts.traffic import (
    FAILED,
    INCONCLUSIVE,
    TrafficFigures,
    WindowSummary,
    WindowThresholds,
    WindowVerdict,
    compare_windows,
    summed,
    windows_between,
)
from corral.contracts.window_figures import GIB, GaugeWindow
from corral.engine.gauge_source import add_group, read_engines
from corral.fleet.checks.change_record import newest_record
from corral.fleet.checks.check import FAIL, NOT_MEASURED, PASS, WARN, Check
from corral.fleet.checks.probe import EngineView, FleetTarget, FleetView
from corral.fleet.checks.verify import Observation, SteadyBaseline
from corral.fleet.engine_memory import memory_in

SOURCE = "router"
PROGRESS_EVERY = 10.0  # seconds between "observed" lines on a long window
GAUGE_EVERY = 1.0  # seconds between readings of the engines' gauges
GPU_MEMORY = "gpu_memory_gib"


@dataclass
class FleetGauges:
    """The engines' gauges over the window: the fleet's (per engine) and each endpoint's, by URL."""

    fleet: GaugeWindow = field(default_factory=GaugeWindow)
    endpoints: dict[str, GaugeWindow] = field(default_factory=dict)

    async def sample(self, session: aiohttp.ClientSession, urls: list[str]) -> None:
        answers = await read_engines(session, urls)
        add_group(self.fleet, answers)
        for url, answer in answers.items():
            add_group(self.endpoints.setdefault(url, GaugeWindow()), {url: answer})


@dataclass
class ObservedWindow:
    """What the router saw between two readings: per endpoint (by URL) and for the fleet (their sum),
    and the router's request counters at both ends. `fleet` None: nothing could be read, `why_not`
    says why."""

    seconds: float
    fleet: WindowSummary | None = None
    endpoints: dict[str, WindowSummary] = field(default_factory=dict)
    request_failures: RequestFailures | None = None
    why_not: str = ""
    last: RouterFleet | None = None  # the later reading (warmup TTFTs are read from it)


def _figures(fleet: RouterFleet) -> dict[str, TrafficFigures]:
    return {e.url: e.traffic for e in fleet.endpoints if e.traffic is not None}


def window_between(
    before: RouterFleet, after: RouterFleet, seconds: float, router: str, gauges: FleetGauges | None = None
) -> ObservedWindow:
    """The window between two `/v1/fleet` readings: each endpoint's figures less its earlier ones (an
    endpoint first listed inside the window counts whole), summed for the fleet; with the engines'
    gauges over the same seconds where read (None: each gauge figure not measured)."""
    observed = ObservedWindow(seconds, last=after)
    if after.totals is not None and before.totals is not None:
        observed.request_failures = RequestFailures(
            source=router, before=before.totals, after=after.totals, during=after.totals.minus(before.totals)
        )
    now, earlier = _figures(after), _figures(before)
    if not now:
        listed = len(after.endpoints)
        observed.why_not = (
            f"the router at {router} reports no per-endpoint traffic figures ({listed} endpoints listed, "
            "none with `traffic`: a router older than Corral's traffic windows)"
        )
        return observed
    try:
        windows = windows_between(earlier, now)
    except ValueError as exc:  # histograms on different bounds: not one series
        observed.why_not = f"the router's traffic figures cannot be added up: {exc}"
        return observed
    per = gauges.endpoints if gauges is not None else {}
    observed.endpoints = {
        url: WindowSummary.of(w, seconds, SOURCE, per.get(url) if gauges is not None else None)
        for url, w in sorted(windows.items())
    }
    total = summed(windows.values())
    assert total is not None
    observed.fleet = WindowSummary.of(total, seconds, SOURCE, gauges.fleet if gauges is not None else None)
    return observed


def with_supervisor_memory(window: ObservedWindow, engines: Mapping[str, EngineView]) -> ObservedWindow:
    """The window with each engine's GPU memory as its supervisor last measured it (`engines`: by
    engine URL; NVML, or the simulator's gauges) where its /metrics showed none, as a real vLLM's
    does not; the fleet's is then their mean, per engine. An engine without a figure says why."""
    if window.fleet is None:
        return window
    endpoints: dict[str, WindowSummary] = {}
    for url, summary in window.endpoints.items():
        engine = engines.get(url)
        if summary.gpu_memory_gib is not None or engine is None or not engine.supervisor_url:
            endpoints[url] = summary
            continue
        if engine.state is None:
            figure, why = None, f"its supervisor did not answer: {engine.state_error or 'no state'}"
        else:
            figure, why = memory_in(engine.state.get("memory"))
        endpoints[url] = _with_memory(
            summary, figure.held_bytes if figure else None, f"its supervisor: {why}"
        )
    fleet = window.fleet
    if fleet.gpu_memory_gib is None:
        held = [s.gpu_memory_gib for s in endpoints.values() if s.gpu_memory_gib is not None]
        whys = [
            f"{url}: {s.unmeasured['gpu_memory_gib']}"
            for url, s in endpoints.items()
            if s.gpu_memory_gib is None
        ]
        gib = sum(held) / len(held) if held else None
        fleet = _with_memory(fleet, gib * GIB if gib is not None else None, whys[0] if whys else "")
    return dataclasses.replace(window, endpoints=endpoints, fleet=fleet)


def _with_memory(summary: WindowSummary, held_bytes: float | None, why: str) -> WindowSummary:
    others = {k: v for k, v in summary.unmeasured.items() if k != GPU_MEMORY}
    if held_bytes is None:
        return summary.model_copy(
            update={"unmeasured": {**others, GPU_MEMORY: why or others.get(GPU_MEMORY, "")}}
        )
    return summary.model_copy(update={"gpu_memory_gib": round(held_bytes / GIB, 3), "unmeasured": others})


async def _read(admin: RouterAdminClient) -> RouterFleet | str:
    try:
        return await admin.fleet()
    except RouterAdminError as exc:
        return str(exc)


async def observe(target: FleetTarget, seconds: float, say: Callable[[str], None]) -> ObservedWindow:
    """Read the router's fleet, wait `seconds` (saying so, and how far it is on a long window), read
    it again: the window between the two readings."""
    if not target.router:
        return ObservedWindow(seconds, why_not="no router given: traffic is read from the router (--router)")
    async with aiohttp.ClientSession() as session:
        admin = RouterAdminClient(session, target.access.router_admin(target.router))
        first = await _read(admin)
        if isinstance(first, str):
            return ObservedWindow(seconds, why_not=f"the router's traffic could not be read: {first}")
        say(f"observing {seconds:g} s of traffic through {target.router} …")
        started = said = time.monotonic()
        urls, gauges = [e.url for e in first.endpoints], FleetGauges()
        while (left := seconds - (time.monotonic() - started)) > 0:
            await asyncio.sleep(min(left, GAUGE_EVERY))
            await gauges.sample(session, urls)
            if (now := time.monotonic()) - said >= PROGRESS_EVERY and now - started < seconds:
                said = now
                say(f"observed {now - started:.0f}/{seconds:g} s")
        second = await _read(admin)
        elapsed = time.monotonic() - started
    if isinstance(second, str):
        return ObservedWindow(elapsed, why_not=f"the router's traffic could not be read again: {second}")
    return window_between(first, second, elapsed, target.router, gauges)


def _steady(record: dict[str, Any]) -> WindowSummary | None:
    latency = record.get("latency")
    steady = latency.get("steady") if isinstance(latency, dict) else None
    try:
        return WindowSummary.model_validate(steady) if isinstance(steady, dict) else None
    except ValidationError:
        return None


def last_steady(
    records: Iterable[tuple[str, dict[str, Any] | None]], router: str | None = None
) -> SteadyBaseline | None:
    """The steady window (`latency.steady`) of the newest record (of this router) that has one."""
    found = newest_record(records, router, lambda record: _steady(record) is not None)
    if found is None:
        return None
    where, record = found
    summary = _steady(record)
    assert summary is not None
    return SteadyBaseline(summary, f"{record.get('kind', 'record')} {where}")


def endpoint_names(view: FleetView, endpoints: Iterable[FleetEndpoint] = ()) -> dict[str, str]:
    """Engine URL -> the name a person knows it by: the supervised engine's, else the router's."""
    names = {e.url: e.name or e.url for e in endpoints}
    names.update({e.engine_url: e.name for e in view.engines if e.engine_url and e.supervisor_url})
    return names


def warmup_ttft_ms(endpoints: Iterable[FleetEndpoint], names: Mapping[str, str]) -> dict[str, float]:
    """Each endpoint's first request's TTFT since it last became routable, by engine name."""
    return {
        names.get(e.url, e.url): round(e.traffic.warmup_ttft_s * 1000.0, 3)
        for e in endpoints
        if e.traffic is not None and e.traffic.warmup_ttft_s is not None
    }


@dataclass(frozen=True)
class TrafficJudgement:
    """The window, its baseline, the `traffic` check, the fleet's verdict and each endpoint's
    (against the fleet's window), by name."""

    window: ObservedWindow
    baseline: SteadyBaseline | None
    check: Check
    verdict: WindowVerdict | None = None
    endpoints: dict[str, WindowVerdict] = field(default_factory=dict)

    @property
    def observation(self) -> Observation:
        return Observation(self.check, self.window.fleet, self.baseline)

    def latency(self, warmup_ttft_ms: dict[str, float]) -> LatencyRecord:
        """The record's `latency`: warmup apart from the steady window and what it was compared with."""
        return LatencyRecord(
            warmup_ttft_ms=warmup_ttft_ms,
            steady=self.window.fleet,
            baseline=self.baseline.summary if self.baseline is not None else None,
            verdict=self.verdict,
        )


def _figures_line(window: WindowSummary) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    def gauge(value: float | None) -> str:
        return "-" if value is None else f"{value:.3g}"

    return (
        f"{window.requests} requests in {window.seconds:g}s, TTFT p50/p99 {ms(window.ttft_p50_ms)}/"
        f"{ms(window.ttft_p99_ms)} ms, ITL p99 {ms(window.itl_p99_ms)} ms, "
        f"queue {gauge(window.queue_waiting)}, KV {gauge(window.kv_usage)}, "
        f"GPU memory {gauge(window.gpu_memory_gib)} GiB (per engine)"
    )


def judge(
    window: ObservedWindow,
    baseline: SteadyBaseline | None,
    limits: WindowThresholds,
    names: Mapping[str, str],
    require_measured: bool = False,
) -> TrafficJudgement:
    """The fleet's window against the baseline, and each endpoint's against the fleet's: any failed
    fails the check (naming the endpoints); too few requests to judge warns (fails with
    --require-measured); no figures is NOT MEASURED."""
    fleet = window.fleet
    if fleet is None:
        unmeasured = Check("traffic", FAIL if require_measured else NOT_MEASURED, window.why_not)
        return TrafficJudgement(window, baseline, unmeasured)
    verdict = compare_windows(fleet, baseline.summary if baseline is not None else None, limits)
    against = (
        f"baseline: {baseline.source}" if baseline is not None else "no earlier record has a steady window"
    )
    endpoints = {  # each against the fleet's window, which the record keeps once (`latency.steady`)
        names.get(url, url): compare_windows(w, fleet, limits).model_copy(update={"baseline": None})
        for url, w in window.endpoints.items()
    }
    bad = sorted((name, v) for name, v in endpoints.items() if v.verdict == FAILED)
    problems = [f"fleet: {verdict.reason} ({against})"] if verdict.verdict == FAILED else []
    problems += [f"{name}: {v.reason} (its baseline: the fleet's window)" for name, v in bad]
    if problems:
        failed = Check("traffic", FAIL, "; ".join(problems))
        return TrafficJudgement(window, baseline, failed, verdict, endpoints)
    line = f"{_figures_line(fleet)} over {len(window.endpoints)} endpoints"
    if verdict.verdict == INCONCLUSIVE:
        check = Check("traffic", FAIL if require_measured else WARN, f"{verdict.reason}; {line}")
        return TrafficJudgement(window, baseline, check, verdict, endpoints)
    detail = f"{line}; {verdict.reason}; {against}; no endpoint worse than the fleet"
    return TrafficJudgement(window, baseline, Check("traffic", PASS, detail), verdict, endpoints)
