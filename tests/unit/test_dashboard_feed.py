"""The dashboard's SSE feed: one shared read per interval whatever the number of clients, pushes only
on change, and a client that does not read is dropped instead of buffered without bound."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from corral.router.dashboard.feed import DashboardFeed
from corral.router.dashboard.sampler import HistoryLoop
from tests.support.waits import eventually


class Fleet:
    def __init__(self) -> None:
        self.view: dict[str, Any] = {"endpoints": [], "n": 0}
        self.reads = 0

    async def __call__(self) -> dict[str, Any]:
        self.reads += 1
        return dict(self.view)


async def test_many_clients_share_one_read_and_get_each_change_once() -> None:
    fleet = Fleet()
    feed = DashboardFeed(fleet, interval=0.01)
    queues = [feed.subscribe() for _ in range(50)]
    first = [await asyncio.wait_for(q.get(), 5) for q in queues]
    assert all(m == first[0] for m in first) and first[0] is not None
    assert first[0].startswith(b"event: fleet\ndata: ") and b'"n":0' in first[0]
    for _ in range(500):  # bounded: at least 10 more reads of an unchanged view
        if fleet.reads >= 10:
            break
        await asyncio.sleep(0.01)
    assert all(q.empty() for q in queues)  # unchanged view: nothing pushed
    assert fleet.reads <= feed.reads + 1  # one read per interval for all 50, not one each
    fleet.view["n"] = 1
    changed = [await asyncio.wait_for(q.get(), 5) for q in queues]
    assert all(m is not None and b'"n":1' in m for m in changed)
    await feed.stop()


async def test_a_client_that_never_reads_is_dropped_with_a_bounded_queue() -> None:
    fleet = Fleet()
    feed = DashboardFeed(fleet, interval=0.005, queue_size=4)
    stuck = feed.subscribe()
    reader = feed.subscribe()
    for n in range(1, 30):
        fleet.view["n"] = n
        message = await asyncio.wait_for(reader.get(), 5)
        assert message is not None
        assert stuck.qsize() <= 4
    assert feed.dropped == 1 and feed.clients == 1
    assert stuck.get_nowait() is None  # its handler ends the response; the browser reconnects
    await feed.stop()


async def test_the_loop_stops_when_the_last_dashboard_closes() -> None:
    fleet = Fleet()
    feed = DashboardFeed(fleet, interval=0.005)
    queue = feed.subscribe()
    await asyncio.wait_for(queue.get(), 5)
    feed.unsubscribe(queue)
    # no open dashboard, no reads: the one loop that reads has ended (a subscriber starts another)
    await eventually(lambda: feed._task is not None and feed._task.done(), "the feed's loop ended")
    await feed.stop()


async def test_a_viewer_gets_the_last_20_exits_from_routing_not_the_routers_whole_record() -> None:
    fleet = Fleet()
    fleet.view["left_routing"] = [{"url": f"http://10.0.0.{i}:8000", "at": i} for i in range(1024)]
    feed = DashboardFeed(fleet, interval=0.01)
    queue = feed.subscribe()
    message = await asyncio.wait_for(queue.get(), 5)
    assert message is not None
    view = orjson.loads(message.split(b"data: ", 1)[1])
    assert [x["at"] for x in view["left_routing"]] == list(range(1004, 1024))
    await feed.stop()


async def test_the_models_window_is_warm_before_a_dashboard_opens_and_stays_so_after() -> None:
    """The router's history tick takes the window's readings from its start: a dashboard opened late
    gets a minute, not "since it opened"; the feed leaves those readings alone when it stops."""
    fleet = Fleet()
    history = HistoryLoop(fleet)
    await history.tick()  # a tick with no dashboard open
    assert len(history.windows._readings) == 1
    feed = DashboardFeed(fleet, interval=0.005, windows=history.windows)
    queue = feed.subscribe()
    message = await asyncio.wait_for(queue.get(), 5)
    assert message is not None and b'"model_windows"' in message
    feed.unsubscribe(queue)
    await eventually(lambda: feed._task is not None and feed._task.done(), "the feed's loop ended")
    assert len(history.windows._readings) == 1  # kept for the next dashboard
    await feed.stop()
