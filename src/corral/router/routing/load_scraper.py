"""Scrapes every READY engine's `/metrics` at a fixed interval, off the request path, into a
`LoadBoard` that scorers read.

Each engine has at most one scrape in flight: an engine slower than the interval is simply scraped less
often (and goes stale, which scorers treat as saturated), it never piles up requests. Only the few
gauges routing needs are read from the text: requests running and waiting (summed over data-parallel
engines), KV-cache usage (the highest), and the LoRA adapters running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from corral.aio import cancel_tasks
from corral.engine import metric_names as m
from corral.engine.metrics_text import Sample, samples
from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.load_board import EngineLoad, LoadBoard

log = logging.getLogger("corral.router.engine_metrics")

_ROUTING_GAUGES = frozenset({m.RUNNING, m.WAITING, m.KV_USAGE, m.LORA_INFO})


def parse_engine_metrics(text: bytes, now: float) -> EngineLoad:
    load = EngineLoad(at=now)
    adapters: frozenset[str] = frozenset()
    latest_lora = -1.0
    for sample in samples(text.decode(errors="replace"), _ROUTING_GAUGES):
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
    def __init__(
        self,
        board: LoadBoard,
        endpoints: Callable[[], list[Endpoint]],
        interval: float,
        timeout: float | None = None,
    ) -> None:
        self.board = board
        self._endpoints = endpoints
        self.interval = interval
        self.timeout = timeout if timeout is not None else max(2 * interval, 0.5)
        self._session: aiohttp.ClientSession | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._scrapes: dict[str, asyncio.Task[None]] = {}
        self.scrapes = 0
        self.failures = 0

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0),
            timeout=aiohttp.ClientTimeout(total=self.timeout),
            skip_auto_headers=("User-Agent",),
        )
        self._loop_task = asyncio.create_task(self._run(), name="engine-metrics-scraper")

    async def stop(self) -> None:
        tasks = [t for t in (self._loop_task, *self._scrapes.values()) if t is not None]
        await cancel_tasks(*tasks)
        self._scrapes.clear()
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        while True:
            endpoints = self._endpoints()
            live = {e.url for e in endpoints}
            for url in [u for u in self.board.loads if u not in live]:
                del self.board.loads[url]
            for endpoint in endpoints:
                if endpoint.state is not EngineState.READY or endpoint.url in self._scrapes:
                    continue
                task = asyncio.create_task(self._scrape(endpoint.url))
                self._scrapes[endpoint.url] = task
                task.add_done_callback(self._forget(endpoint.url))
            await asyncio.sleep(self.interval)

    def _forget(self, url: str) -> Callable[[asyncio.Task[None]], None]:
        def done(_task: asyncio.Task[None]) -> None:
            self._scrapes.pop(url, None)

        return done

    async def _scrape(self, url: str) -> None:
        assert self._session is not None
        try:
            async with self._session.get(url + "/metrics") as resp:
                if resp.status != 200:
                    raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status)
                text = await resp.read()
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            self.failures += 1
            log.debug("metrics of %s not scraped: %s", url, exc)
            return  # the old entry ages into staleness
        self.board.loads[url] = parse_engine_metrics(text, time.monotonic())
        self.scrapes += 1
