"""One shared snapshot loop feeding every open dashboard over Server-Sent Events.

The loop reads the router's fleet view (the same dict `/v1/fleet` answers) at most once per
`interval` seconds, and only while at least one dashboard is open. It pushes a snapshot to the
clients only when it changed, so N dashboards cost one read per interval, not N. Each client has a
small bounded queue; a client whose queue is full (it reads slower than the fleet changes) is
dropped, and its browser's EventSource reconnects and starts from a fresh snapshot.

Each snapshot carries, beside the fleet view, `model_windows`: per-model figures over the last
minute (`windows.py`), from readings the router's history loop takes every 5 s from its start
(`sampler.py`; a feed built without one takes its own, which start afresh when nobody watches); and
`rollout`, the rollout in flight or the last one (`rollout.py`), for the page's banner.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from corral.router.dashboard.rollout import RolloutWatch
from corral.router.dashboard.windows import ModelWindows

Snapshot = Callable[[], Awaitable[dict[str, Any]]]

HEARTBEAT = b": heartbeat\n\n"
# the page lists the last 20 events; the router keeps up to 1,024 exits from routing, which the feed
# does not send to every viewer twice a second
EVENTS_SHOWN = 20


class DashboardFeed:
    """Coalesced fleet snapshots, fanned out to bounded per-client queues."""

    def __init__(
        self,
        snapshot: Snapshot,
        interval: float = 0.5,
        heartbeat: float = 15.0,
        queue_size: int = 8,
        windows: ModelWindows | None = None,
        rollout: RolloutWatch | None = None,
    ) -> None:
        self._rollout = rollout
        self._snapshot = snapshot
        # windows kept by another (the history loop, which reads from the router's start) are not cleared
        self._own_windows = windows is None
        self._windows = windows if windows is not None else ModelWindows()
        self._interval = interval
        self._heartbeat = heartbeat
        self._queue_size = queue_size
        self._clients: set[asyncio.Queue[bytes | None]] = set()
        self._last: bytes | None = None
        self._task: asyncio.Task[None] | None = None
        self.reads = 0  # snapshots taken (for tests and for the curious)
        self.dropped = 0  # clients dropped for reading too slowly

    @property
    def clients(self) -> int:
        return len(self._clients)

    def _ensure_loop(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self._clients:
            try:
                view = await self._snapshot()
                view["left_routing"] = list(view.get("left_routing") or [])[-EVENTS_SHOWN:]
                view["model_windows"] = self._windows.update(view, time.monotonic())
                if self._rollout is not None:  # the banner: a rollout in flight, or the last one
                    view["rollout"] = self._rollout.update(view, time.time())
                body = orjson.dumps(view)
            except Exception as exc:  # a failed read is shown on the page; the loop goes on
                body = orjson.dumps({"error": f"the router could not read its fleet view: {exc}"})
            self.reads += 1
            if body != self._last:
                self._last = body
                self._publish(b"event: fleet\ndata: " + body + b"\n\n")
            await asyncio.sleep(self._interval)
        self._last = None  # nobody listens: the next client starts from a fresh read
        if self._own_windows:
            self._windows.clear()

    def _publish(self, message: bytes) -> None:
        for queue in list(self._clients):
            try:
                queue.put_nowait(message)
            except asyncio.QueueFull:
                self._drop(queue)

    def _drop(self, queue: asyncio.Queue[bytes | None]) -> None:
        self._clients.discard(queue)
        self.dropped += 1
        with contextlib.suppress(asyncio.QueueEmpty):
            while True:
                queue.get_nowait()
        queue.put_nowait(None)  # tells the client's handler to end its response

    def subscribe(self) -> asyncio.Queue[bytes | None]:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=self._queue_size)
        if self._last is not None:
            queue.put_nowait(b"event: fleet\ndata: " + self._last + b"\n\n")
        self._clients.add(queue)
        self._ensure_loop()
        return queue

    def unsubscribe(self, queue: asyncio.Queue[bytes | None]) -> None:
        self._clients.discard(queue)

    async def stop(self) -> None:
        for queue in list(self._clients):
            self._drop(queue)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def serve(self, request: web.Request) -> web.StreamResponse:
        """GET /dashboard/events: `event: fleet` with the whole view on change; a comment as heartbeat."""
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        await response.write(b"retry: 2000\n\n")
        queue = self.subscribe()
        try:
            while True:
                try:
                    message = await asyncio.wait_for(queue.get(), self._heartbeat)
                except TimeoutError:
                    message = HEARTBEAT
                if message is None:
                    break
                await response.write(message)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.unsubscribe(queue)
        return response
