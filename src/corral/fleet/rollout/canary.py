"""A rollout's CANARY: a new serving group's window of real traffic, read from the router's
per-endpoint figures (`GET /v1/fleet`: errors, TTFT, ITL) and from the engines' own gauges (queue, KV
utilization: `engine.gauge_source.sample_engines`, read at every check; GPU memory from the simulator's
gauge, else as each engine's supervisor last measured it, handed in by the rollout),
judged against the old groups' over the same seconds with the one comparison in contracts/traffic.py;
it stops early once the new group is judged worse."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

from corral.contracts.router import FleetEndpoint
from corral.contracts.traffic import (
    FAILED,
    INCONCLUSIVE,
    PASSED,
    TrafficFigures,
    WindowSummary,
    WindowThresholds,
    WindowVerdict,
    compare_windows,
    summed,
    windows_between,
)
from corral.contracts.window_figures import GaugeWindow
from corral.engine.gauge_source import GaugeSampler

SOURCE = "router"
CHECK_SECONDS = 0.5  # how often the window is judged while it runs

Listing = Callable[[], Awaitable[dict[str, FleetEndpoint]]]


class CanaryBlind(Exception):
    """The router does not report the figures a canary needs; the message says what to do."""


@dataclass(frozen=True)
class CanarySettings:
    """`seconds` 0: no canary. `thresholds`: how much worse than the old groups the new one may be."""

    seconds: float = 0.0
    thresholds: WindowThresholds = field(default_factory=WindowThresholds)
    check_seconds: float = CHECK_SECONDS

    def __post_init__(self) -> None:
        if self.seconds < 0:
            raise ValueError(f"canary seconds must be 0 (no canary) or more, not {self.seconds:g}")
        if self.check_seconds <= 0:
            raise ValueError(f"the canary's check interval must be above 0, not {self.check_seconds:g}")


def window_of(
    start: dict[str, FleetEndpoint], now: dict[str, FleetEndpoint], engines: Collection[str]
) -> TrafficFigures | None:
    """What `engines` served between two listings, summed; None when none of them is listed now.
    An engine not listed at the start contributes everything it has (it joined inside the window);
    one no longer listed at the end contributes nothing (its last figures are gone with it)."""
    blind = [url for url in engines if url in now and now[url].traffic is None]
    if blind:
        raise CanaryBlind(
            f"the router does not report per-endpoint traffic for {blind[0]} (no `traffic` in its "
            "/v1/fleet): run a router that does, or roll out without a canary (--canary-seconds 0)"
        )
    return summed(windows_between(_figures(start, engines), _figures(now, engines)).values())


def _figures(listing: dict[str, FleetEndpoint], engines: Collection[str]) -> dict[str, TrafficFigures]:
    return {
        url: e.traffic for url in engines if (e := listing.get(url)) is not None and e.traffic is not None
    }


def judge(
    new: TrafficFigures | None,
    old: TrafficFigures | None,
    seconds: float,
    thresholds: WindowThresholds,
    new_gauges: GaugeWindow | None = None,
    old_gauges: GaugeWindow | None = None,
) -> WindowVerdict:
    """The new group's window against the old groups' (None: no old group serves, so the new one is
    held to the error ratio alone); gauges None: not read (each gauge figure then not measured)."""
    window = WindowSummary.of(new or TrafficFigures(), seconds, SOURCE, new_gauges)
    baseline = WindowSummary.of(old, seconds, SOURCE, old_gauges) if old is not None else None
    return compare_windows(window, baseline, thresholds)


async def watch(
    listing: Listing,
    new: Collection[str],
    old: Collection[str],
    settings: CanarySettings,
    sample: GaugeSampler | None = None,
) -> WindowVerdict:
    """Judge the new engines against the old over `settings.seconds`, every `check_seconds` (reading
    both groups' gauges with `sample` each time, where given): the first failed verdict ends the
    window at once (fewer clients meet the bad group); otherwise the verdict at the end, passed or
    inconclusive."""
    start = await listing()
    began = time.monotonic()
    new_gauges = GaugeWindow() if sample is not None else None
    old_gauges = GaugeWindow() if sample is not None else None
    while True:
        elapsed = time.monotonic() - began
        await asyncio.sleep(max(0.0, min(settings.check_seconds, settings.seconds - elapsed)))
        now = await listing()
        if sample is not None and new_gauges is not None and old_gauges is not None:
            await asyncio.gather(
                sample(new, new_gauges), sample(old, old_gauges) if old else asyncio.sleep(0)
            )
        elapsed = time.monotonic() - began
        baseline = window_of(start, now, old) if old else None
        verdict = judge(
            window_of(start, now, new), baseline, elapsed, settings.thresholds, new_gauges, old_gauges
        )
        if verdict.verdict == FAILED or elapsed >= settings.seconds:
            return verdict


def failure(verdict: WindowVerdict, group: str, settings: CanarySettings) -> str | None:
    """Why a verdict stops the rollout (None: it passed). Inconclusive stops it too: a canary nobody
    could judge must not read as passed."""
    if verdict.verdict == PASSED:
        return None
    window = verdict.window
    if verdict.verdict == INCONCLUSIVE:
        return (
            f"canary inconclusive: {group} served {window.requests} requests in {window.seconds:g}s, fewer "
            f"than the {settings.thresholds.min_requests} needed to judge it; send traffic during the "
            "rollout, lengthen --canary-seconds, or pass --canary-min-requests 0 to accept a quiet window"
        )
    return f"canary failed after {window.seconds:g}s: {group} {verdict.reason}"


def summary(verdict: WindowVerdict, group: str) -> str:
    """A passed verdict in one line, for the step's detail."""
    window, baseline = verdict.window, verdict.baseline
    against = f" against {baseline.requests} on the old groups" if baseline is not None else ""
    return (
        f"canary passed: {group} served {window.requests} requests in {window.seconds:g}s{against}; "
        f"{verdict.reason}"
    )
