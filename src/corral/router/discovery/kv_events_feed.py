"""The engines' KV-cache events into the router's `KvIndex`: one ZMQ SUB per endpoint that publishes
(its address from its supervisor's state, else its membership source), replay through the engine's
replay socket on connect and after a sequence gap, a new engine process (its sequence starting over)
clearing what the index held for it, and each subscription stopped when its endpoint leaves. Event
intake runs beside the request path on the router's loop; nothing here is awaited by a request."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from corral.aio import cancel_tasks
from corral.engine.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    parse_published,
    seq_frame,
)
from corral.engine.kv_events_address import KvEventsAddress, parse_address
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.kv_index import KvIndex

log = logging.getLogger("corral.router.kv_events")

SYNC_SECONDS = 1.0
REPLAY_TIMEOUT_SECONDS = 2.0
BACKOFF_SECONDS = (0.5, 10.0)


def kv_events_text(endpoint: Endpoint) -> str | None:
    """The `PUB[,REPLAY]` address `endpoint`'s engine publishes at: its supervisor's word, else its
    membership source's; None when neither gives one."""
    view = endpoint.supervisor
    return view.kv_events if view is not None and view.kv_events else endpoint.kv_events


def kv_events_address(endpoint: Endpoint) -> KvEventsAddress:
    """Where `endpoint`'s engine publishes KV events, ready to connect to; a ValueError when the one
    given cannot be read, LookupError when none is given."""
    text = kv_events_text(endpoint)
    if not text:
        raise LookupError(endpoint.url)
    return parse_address(text, urlsplit(endpoint.url).hostname or "127.0.0.1")


def apply_batch(index: KvIndex, url: str, batch: KVEventBatch) -> None:
    """One batch into the index. Only the GPU tier of the first KV cache group is indexed: the blocks
    a request's prefill finds without a transfer."""
    for event in batch.events:
        if isinstance(event, BlockStored):
            if event.group_idx in (None, 0) and event.medium in (None, MEDIUM_GPU):
                index.stored(
                    url,
                    event.block_hashes,
                    event.parent_block_hash,
                    event.token_ids,
                    event.block_size,
                    event.lora_name,
                )
        elif isinstance(event, BlockRemoved):
            if event.group_idx in (None, 0) and event.medium in (None, MEDIUM_GPU):
                index.removed(url, event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            index.cleared(url)


class EngineEvents:
    """One engine's subscription: the live stream, replays, and what it has seen (for /v1/fleet)."""

    def __init__(
        self, ctx: zmq.asyncio.Context, endpoint: Endpoint, address: KvEventsAddress, index: KvIndex
    ) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.url = endpoint.url
        self.address = address
        self.text = kv_events_text(endpoint)  # as given, to notice a change without parsing it again
        self.index = index
        self.prefix_epoch = _epoch(endpoint)
        self.last_seq: int | None = None
        # the sequence numbers the last replay applied: live copies of them are skipped, not a restart
        self._replayed: tuple[int, int] | None = None
        self.batches = 0
        self.gaps = 0
        self.replays = 0
        self.lost = 0  # batches a gap lost that no replay could bring back
        self.restarts = 0
        self.bad = 0
        self.last_heard: float | None = None
        self.error: str | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.index.watch(self.url)
        self.task = asyncio.create_task(self.run(), name=f"corral-kv-events-{self.url}")

    async def run(self) -> None:
        delay = BACKOFF_SECONDS[0]
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of one subscription is retried
                self.error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "KV events of %s (%s): %s; again in %.1f s", self.url, self.address.endpoint, exc, delay
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_SECONDS[1])

    async def _session(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            sub.connect(self.address.endpoint)
            log.info("KV events of %s: subscribed to %s", self.url, self.address.endpoint)
            await self._replay(0 if self.last_seq is None else self.last_seq + 1)
            while True:
                frames = await sub.recv_multipart()
                _, seq, payload = parse_published(frames)
                await self._live(seq, payload)
        finally:
            sub.close(linger=0)

    async def _live(self, seq: int, payload: bytes) -> None:
        self.last_heard = time.monotonic()
        last = self.last_seq
        if last is not None and seq <= last:
            replayed = self._replayed
            if replayed is not None and replayed[0] <= seq <= replayed[1]:
                return  # also came through the replay
            self.restarts += 1
            log.info(
                "KV events of %s: sequence went back %d -> %d: a new engine process", self.url, last, seq
            )
            self.index.cleared(self.url)
            self.last_seq = None
            await self._replay(0)
            if self.last_seq is not None and seq <= self.last_seq:
                return
        elif seq > (last + 1 if last is not None else 0):
            # a gap, or a first live batch that is not the engine's first while the replay on connect
            # brought nothing (it ran before the batches the subscription joined too late to see)
            self.gaps += 1
            await self._replay(last + 1 if last is not None else 0)
            if self.last_seq is not None and seq <= self.last_seq:
                return
            if self.last_seq is not None and seq > self.last_seq + 1:
                self.lost += seq - self.last_seq - 1
        self._replayed = None
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except ValueError as exc:
            self.bad += 1
            if self.bad == 1:
                log.warning("KV events of %s: %s", self.url, exc)
            self.last_seq = seq
            return
        apply_batch(self.index, self.url, batch)
        self.batches += 1
        self.last_seq = seq

    async def _replay(self, start: int) -> None:
        """Ask the engine's replay socket for every batch from `start` it still buffers, and apply them."""
        if self.address.replay is None:
            return
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        first: int | None = None
        try:
            dealer.connect(self.address.replay)
            # a DEALER with no peer yet holds the send: bounded like each answer
            await asyncio.wait_for(dealer.send_multipart([b"", seq_frame(start)]), REPLAY_TIMEOUT_SECONDS)
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT_SECONDS)
                _, seq, payload = parse_published(frames[1:])
                if seq < 0:
                    break
                first = seq if first is None else first
                if self.last_seq is None or seq > self.last_seq:
                    self._apply(seq, payload)
            self.replays += 1
        except TimeoutError:
            log.info(
                "KV events of %s: no replay from %s in %.0f s",
                self.url,
                self.address.replay,
                REPLAY_TIMEOUT_SECONDS,
            )
        finally:
            dealer.close(linger=0)
        if first is not None:
            self._replayed = (first, self.last_seq if self.last_seq is not None else first)
            if first > start:
                self.lost += first - start

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "endpoint": self.address.endpoint,
            "replay": self.address.replay,
            "last_seq": self.last_seq,
            "batches": self.batches,
            "gaps": self.gaps,
            "replays": self.replays,
            "lost": self.lost,
            "restarts": self.restarts,
            "undecodable": self.bad,
            "heard_seconds_ago": None if self.last_heard is None else round(now - self.last_heard, 3),
            "error": self.error,
            "index": self.index.to_json(self.url),
        }


def _epoch(endpoint: Endpoint) -> str | None:
    return endpoint.supervisor.prefix_epoch if endpoint.supervisor is not None else None


class KvEventFeeds:
    """Keeps one `EngineEvents` per publishing endpoint in membership, checked every `SYNC_SECONDS`
    (an informer's resync: the endpoints' list is the truth, not a stream of changes)."""

    def __init__(
        self,
        index: KvIndex,
        endpoints: Callable[[], list[Endpoint]],
        sync_seconds: float = SYNC_SECONDS,
    ) -> None:
        self.index = index
        self._endpoints = endpoints
        self.sync_seconds = sync_seconds
        self._feeds: dict[str, EngineEvents] = {}
        self._unreadable: set[str] = set()  # endpoints whose address was refused (logged once)
        self._stopping: set[asyncio.Task[None]] = set()
        self._ctx: zmq.asyncio.Context | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self.sync()
        self._task = asyncio.create_task(self._loop(), name="corral-kv-events-sync")

    async def stop(self) -> None:
        tasks = [f.task for f in self._feeds.values() if f.task is not None]
        if self._task is not None:
            tasks.append(self._task)
        await cancel_tasks(*tasks, *self._stopping)
        self._feeds.clear()
        if self._ctx is not None:
            # every socket is closed by its task's end; destroy, not term, so a straggler cannot block
            self._ctx.destroy(linger=0)
            self._ctx = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.sync_seconds)
            try:
                self.sync()
            except Exception:  # a bad endpoint must not stop the others' feeds
                log.exception("KV events: sync failed")

    def sync(self) -> None:
        """Start feeds for endpoints that publish, restart those whose address, endpoint object or prefix
        epoch changed (their blocks are forgotten), stop those whose endpoint left."""
        if self._ctx is None:
            return
        seen: set[str] = set()
        for endpoint in self._endpoints():
            feed = self._feeds.get(endpoint.url)
            if (
                feed is not None
                and feed.endpoint is endpoint
                and feed.text == kv_events_text(endpoint)
                and feed.prefix_epoch == _epoch(endpoint)
            ):
                seen.add(endpoint.url)  # unchanged: nothing to parse (a resync of 1,000 stays cheap)
                continue
            try:
                address = kv_events_address(endpoint)
            except LookupError:
                continue
            except ValueError as exc:
                if endpoint.url not in self._unreadable:
                    self._unreadable.add(endpoint.url)
                    log.warning("KV events of %s not followed: %s", endpoint.url, exc)
                continue
            seen.add(endpoint.url)
            if feed is not None:
                self._drop(endpoint.url, "its address, engine or prefix epoch changed")
            feed = self._feeds[endpoint.url] = EngineEvents(self._ctx, endpoint, address, self.index)
            feed.start()
        for url in [u for u in self._feeds if u not in seen]:
            self._drop(url, "it left membership or stopped publishing")

    def _drop(self, url: str, why: str) -> None:
        feed = self._feeds.pop(url)
        if feed.task is not None:
            feed.task.cancel()
            self._stopping.add(feed.task)  # its sockets close when it ends; stop() waits for that
            feed.task.add_done_callback(self._stopping.discard)
        self.index.forget(url)
        log.info("KV events of %s: unsubscribed, %s", url, why)

    def forget(self, url: str, why: str) -> None:
        """The endpoint left routing for good: stop its feed now, not at the next sync."""
        if url in self._feeds:
            self._drop(url, why)

    def publishing(self, url: str) -> bool:
        return url in self._feeds

    def to_json(self, url: str) -> dict[str, Any] | None:
        feed = self._feeds.get(url)
        return None if feed is None else feed.to_json(time.monotonic())

    @property
    def count(self) -> int:
        return len(self._feeds)
