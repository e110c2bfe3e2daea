"""The router's background tick that keeps the dashboard's history (`history.py`) and the models'
last minute (`windows.py`) and follows rollouts (`rollout.py`): one read of the fleet view every
`step` seconds from start to stop, whether or not a dashboard is open; and `GET /dashboard/series`,
the charts' points."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from corral.router.dashboard.history import FleetHistory
from corral.router.dashboard.rollout import RolloutWatch
from corral.router.dashboard.windows import ModelWindows

log = logging.getLogger("corral.router.dashboard")

Snapshot = Callable[[], Awaitable[dict[str, Any]]]


class HistoryLoop:
    def __init__(self, snapshot: Snapshot, history: FleetHistory | None = None) -> None:
        self._snapshot = snapshot
        self.history = history if history is not None else FleetHistory()
        self.rollout = RolloutWatch()
        self.windows = ModelWindows()  # the models' last minute, warm before any dashboard opens
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def tick(self) -> None:
        view = await self._snapshot()
        wall = time.time()
        now = time.monotonic()
        self.history.sample(view, wall, now)
        self.windows.update(view, now)
        self.rollout.update(view, wall)

    async def _run(self) -> None:
        failing = False
        while True:
            try:
                await self.tick()
                failing = False
            except Exception as exc:  # a failed read leaves a gap in the charts; the loop goes on
                if not failing:
                    log.warning("the dashboard's history could not read the fleet view: %s", exc)
                failing = True
            await asyncio.sleep(self.history.step)

    async def serve(self, request: web.Request) -> web.Response:
        """GET /dashboard/series: every chart's points (`FleetHistory.to_json`)."""
        return web.Response(
            body=orjson.dumps(self.history.to_json()),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )
