"""Scrapes the READY engines' `/metrics`, off the request path, into a `LoadBoard` that scorers read, at a
pace that adapts to the fleet: no engine more often than `interval`, the whole fleet within a budget of
scrapes per second, spread evenly over time (a thousand engines are never scraped in one burst).

Each engine has at most one scrape in flight: an engine slower than its turn is skipped that round (and
goes stale, which scorers treat as saturated), it never piles up requests. Scrapes are lean HTTP/1.1
GETs (`corral.engine.page_get`): at a thousand engines a general-purpose client's bookkeeping was most
of a scrape's cost. Only the few gauges routing needs are read, from the answer's bytes without
decoding the page: requests running and waiting (summed over data-parallel engines), KV-cache usage
(the highest), and the LoRA adapters running.

A page is an engine's untrusted input: over `MAX_PAGE_BYTES` (the rest is not read), `MAX_PAGE_LINES`
lines or a routing line over `MAX_LINE_BYTES`, it costs that engine this scrape (its last load ages into
staleness), counted on the router's `/metrics` and logged once until the engine's page is read again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from corral.aio import cancel_tasks
from corral.engine import metric_names as m
from corral.engine.metrics_text import LineTooLong, Sample, samples
from corral.engine.page_get import KEEPALIVE_SECONDS, PageClient, PageTooLarge
from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.load_board import EngineLoad, LoadBoard
from corral.router.telemetry.engine_input import METRICS_PAGE, EngineInputRefusals

log = logging.getLogger("corral.router.engine_metrics")

_ROUTING_GAUGES = frozenset({m.RUNNING, m.WAITING, m.KV_USAGE, m.LORA_INFO})

# Scrapes per second the router spends on the whole fleet by default: each costs the router ~0.25 ms of
# CPU on a new connection (`PageClient`: the connection, the 54 KB page read, its four gauges found) and
# the engine's API server one request, so 50/s keep an idle router at 1-2% of a core; past
# `budget * interval` engines (50), each engine is scraped less often than `interval` (every 20 s at
# 1,000) and the router's own in-flight counts are the live signal.
DEFAULT_BUDGET = 50.0
# Metrics older than this many scrape periods count as saturated (unless the config fixes stale_after).
STALE_PERIODS = 5.0
MIN_STALE_SECONDS = 0.5
# A real vLLM page (tests/data/vllm-samples/metrics.body): 54 KB, 663 lines, the longest 1,063 bytes. Sixteen
# data-parallel ranks and every adapter combination `lora_requests_info` kept are ~20x that; these
# bounds are ~150x it, so only a page no engine writes is refused.
MAX_PAGE_BYTES = 8 << 20
MAX_PAGE_LINES = 100_000
MAX_LINE_BYTES = 64 << 10  # a lora_requests_info line lists the adapters running: up to max_loras names


class PageRefused(ValueError):
    """A page outside the bounds; `reason` names which, for the counter."""

    def __init__(self, reason: str, why: str) -> None:
        super().__init__(why)
        self.reason = reason


def parse_engine_metrics(text: bytes, now: float) -> EngineLoad:
    """The load a page says; PageRefused when it is outside the bounds."""
    lines = text.count(b"\n")
    if lines > MAX_PAGE_LINES:
        raise PageRefused("too_many_lines", f"{lines} lines (at most {MAX_PAGE_LINES})")
    load = EngineLoad(at=now)
    adapters: frozenset[str] = frozenset()
    latest_lora = -1.0
    try:
        found = list(samples(text, _ROUTING_GAUGES, max_line_bytes=MAX_LINE_BYTES))
    except LineTooLong as exc:
        raise PageRefused("line_too_long", str(exc)) from None
    for sample in found:
        name, value = sample.name, sample.value
        if name == m.RUNNING:
            load.running += value
        elif name == m.WAITING:
            load.waiting += value
        elif name == m.KV_USAGE:
            load.kv_usage = max(load.kv_usage, value)
        elif value > latest_lora:  # the latest lora_requests_info sample is the current one
            latest_lora = value
            adapters = _running_adapters(sample)
    load.running_adapters = adapters
    return load


def _running_adapters(sample: Sample) -> frozenset[str]:
    try:
        running = sample.labels.get(m.LORA_RUNNING_LABEL, "")
    except ValueError:
        return frozenset()
    return frozenset(a for a in running.split(",") if a)


class LoadScraper:
    """`interval`: the shortest time between two scrapes of one engine; `budget`: scrapes per second for
    the whole fleet; `stale_after`: fixed staleness, or None to follow the period (`STALE_PERIODS`)."""

    def __init__(
        self,
        board: LoadBoard,
        endpoints: Callable[[], list[Endpoint]],
        interval: float,
        timeout: float | None = None,
        *,
        budget: float = DEFAULT_BUDGET,
        stale_after: float | None = None,
        tick: float | None = None,
        refusals: EngineInputRefusals | None = None,
    ) -> None:
        if budget <= 0:
            raise ValueError(f"scrape budget {budget!r}: give scrapes per second, > 0")
        self.board = board
        self._endpoints = endpoints
        self.interval = interval
        self.budget = budget
        self.fixed_stale = stale_after
        self.timeout = timeout if timeout is not None else max(2 * interval, 0.5)
        self.tick = tick if tick is not None else min(0.1, interval)  # how often scrapes are started
        self._client: PageClient | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._scrapes: dict[str, asyncio.Task[None]] = {}
        self._round: list[Endpoint] = []  # this round's READY engines, scraped in order
        self._cursor = 0
        self._credit = 0.0  # scrapes earned and not yet started
        self.period = interval  # seconds between two scrapes of one engine, as the fleet's size sets it
        self.scrapes = 0
        self.failures = 0
        self.skipped = 0  # turns passed because the engine's previous scrape had not ended
        self.refusals = refusals if refusals is not None else EngineInputRefusals()
        self._refusing: set[str] = set()  # engines whose last page was refused (logged once)

    def period_for(self, engines: int) -> float:
        """Seconds between two scrapes of each of `engines` engines: `interval`, or longer when the
        budget cannot cover them all that often."""
        return max(self.interval, engines / self.budget)

    async def start(self) -> None:
        self._client = PageClient(self.timeout, max_bytes=MAX_PAGE_BYTES)
        self._loop_task = asyncio.create_task(self._run(), name="engine-metrics-scraper")

    async def stop(self) -> None:
        tasks = [t for t in (self._loop_task, *self._scrapes.values()) if t is not None]
        await cancel_tasks(*tasks)
        self._scrapes.clear()
        if self._client is not None:
            self._client.close()

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            now = time.monotonic()
            self.step(now - last)
            last = now
            await asyncio.sleep(self.next_wait())

    def next_wait(self) -> float:
        """Seconds to sleep until the next scrape is earned: at least `tick` (also while no engine is
        READY, to find the first soon), at most one period. A small fleet wakes the loop only when a
        scrape is due (2 engines at 1 s: twice a second, not ten times; each wake-up costs the router
        CPU whether or not it scrapes); a large one wakes every `tick` and starts several."""
        if not self._round:
            return self.tick
        rate = len(self._round) / self.period
        return min(max(self.tick, self.period), max(self.tick, (1.0 - self._credit) / rate))

    def step(self, elapsed: float) -> int:
        """Start the scrapes that `elapsed` seconds earned; a new round (a fresh list of READY engines,
        the period and staleness it sets) begins when the last one is done. How many started."""
        if self._cursor >= len(self._round):
            self._new_round()
        rate = len(self._round) / self.period if self._round else 0.0
        # at most one period's worth of credit: a stalled loop does not fire a burst when it resumes
        self._credit = min(self._credit + rate * elapsed, max(1.0, float(len(self._round))))
        started = 0
        while self._credit >= 1.0 and self._cursor < len(self._round):
            endpoint = self._round[self._cursor]
            self._cursor += 1
            if endpoint.state is not EngineState.READY:
                continue  # left routing since the round began: costs nothing
            self._credit -= 1.0
            if endpoint.url in self._scrapes:
                self.skipped += 1
                continue
            task = asyncio.create_task(self._scrape(endpoint.url))
            self._scrapes[endpoint.url] = task
            task.add_done_callback(self._forget(endpoint.url))
            started += 1
        return started

    def _new_round(self) -> None:
        endpoints = self._endpoints()
        live = {e.url for e in endpoints}
        loads = self.board.loads
        for url in [u for u in loads if u not in live]:
            del loads[url]
        self._refusing &= live
        self._round = [e for e in endpoints if e.state is EngineState.READY]
        self._cursor = 0
        self._credit %= 1.0  # what the last round earned beyond its engines is not spent in a burst
        period = self.period_for(len(self._round))
        if period != self.period:
            log.info(
                "scraping %d engines' /metrics every %.3g s (%.3g scrapes/s)",
                len(self._round),
                period,
                len(self._round) / period,
            )
        self.period = period
        # a connection idle for a whole period is dropped by the engine anyway (uvicorn: 5 s)
        if self._client is not None:
            self._client.keepalive = KEEPALIVE_SECONDS if period < KEEPALIVE_SECONDS else 0.0
        if self.fixed_stale is None:
            self.board.stale_after = max(STALE_PERIODS * period, MIN_STALE_SECONDS)

    def _forget(self, url: str) -> Callable[[asyncio.Task[None]], None]:
        def done(_task: asyncio.Task[None]) -> None:
            self._scrapes.pop(url, None)

        return done

    async def _scrape(self, url: str) -> None:
        assert self._client is not None
        try:
            status, text = await self._client.get(url, "/metrics")
        except PageTooLarge as exc:
            self._refused(url, PageRefused("too_large", str(exc)))
            return
        except (TimeoutError, ConnectionError) as exc:
            self._failed(url, str(exc) or type(exc).__name__)
            return
        if status != 200:
            self._failed(url, f"GET /metrics answered {status}")
            return
        try:
            self.board.loads[url] = parse_engine_metrics(text, time.monotonic())
        except PageRefused as exc:
            self._refused(url, exc)
            return
        self.scrapes += 1
        if url in self._refusing:
            self._refusing.discard(url)
            log.info("metrics of %s read again", url)

    def _refused(self, url: str, exc: PageRefused) -> None:
        self.failures += 1
        self.refusals.count(METRICS_PAGE, exc.reason)
        if url not in self._refusing:
            self._refusing.add(url)
            log.warning("metrics page of %s refused: %s; its load ages into staleness", url, exc)

    def _failed(self, url: str, why: str) -> None:
        self.failures += 1
        log.debug("metrics of %s not scraped: %s", url, why)  # the old entry ages into staleness
