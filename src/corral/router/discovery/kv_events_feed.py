"""The engines' KV-cache events into the router's `KvIndex`: one ZMQ SUB per endpoint that publishes
(its address from its supervisor's state, else its membership source), replay through the engine's
replay socket on connect and after a sequence gap, a new engine process (its sequence starting over)
clearing what the index held for it, and each subscription stopped when its endpoint leaves. Event
intake runs beside the request path on the router's loop; nothing here is awaited by a request.

An engine's events are untrusted input: a message over `MAX_MESSAGE_BYTES` is dropped by ZMQ itself, and
a batch that does not decode, falls outside `kv_event_bounds`, changes the engine's block size or fails in
the index makes that engine's feed bad: its index entries are dropped (routing to it falls back to the
prefix memory), the refusal is counted and logged once, and the feed is followed again after a pause
that doubles each time, from the batch after the refused one (never a replay of it)."""

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
from corral.engine.kv_event_bounds import MAX_MESSAGE_BYTES, BadKvEvents, check_batch
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
from corral.router.telemetry.engine_input import KV_EVENTS, EngineInputRefusals

log = logging.getLogger("corral.router.kv_events")

SYNC_SECONDS = 1.0
REPLAY_TIMEOUT_SECONDS = 2.0
BACKOFF_SECONDS = (0.5, 10.0)
# A feed that sent a refused batch waits this long before it is followed again, doubling to the cap.
PAUSE_SECONDS = (5.0, 300.0)
# Messages the SUB socket queues unread: a second of scheduler steps; with MAX_MESSAGE_BYTES, at most
# 256 MiB queued should the router fall behind a hostile publisher.
RECEIVE_QUEUE = 64
# Batches one replay may bring: vLLM buffers `buffer_steps` (10,000 by default); more is not a replay.
MAX_REPLAY_BATCHES = 200_000


class FeedRefused(Exception):
    """The engine sent batch `seq` and the router refuses it (`reason`: how, for the counter)."""

    def __init__(self, seq: int, reason: str, why: str) -> None:
        super().__init__(why)
        self.seq = seq
        self.reason = reason


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
    a request's prefill finds without a transfer. A block size other than the one the engine stated
    (since its cache was last cleared) is BadKvEvents: one engine's cache group has one block size."""
    for event in batch.events:
        if isinstance(event, BlockStored):
            if event.group_idx in (None, 0) and event.medium in (None, MEDIUM_GPU):
                stated = index.block_size(url)
                if stated is not None and event.block_size != stated and index.holds_blocks(url):
                    raise BadKvEvents(f"block_size {event.block_size} after this engine stated {stated}")
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
        self,
        ctx: zmq.asyncio.Context,
        endpoint: Endpoint,
        address: KvEventsAddress,
        index: KvIndex,
        refusals: EngineInputRefusals | None = None,
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
        self.refused = 0  # batches refused: each paused the feed
        self.refusals = refusals
        self.indexing = True  # False while paused after a refused batch: routing asks the prefix memory
        self.pause = PAUSE_SECONDS[0]
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
            except FeedRefused as refused:
                await self._paused(refused)
                delay = BACKOFF_SECONDS[0]
                continue
            except Exception as exc:  # any failure of one subscription is retried
                self.error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "KV events of %s (%s): %s; again in %.1f s", self.url, self.address.endpoint, exc, delay
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_SECONDS[1])

    async def _paused(self, refused: FeedRefused) -> None:
        """The engine sent a batch the router refuses: forget its blocks, pause, follow it again from
        the batch after that one."""
        self.refused += 1
        if self.refusals is not None:
            self.refusals.count(KV_EVENTS, refused.reason)
        self.error = f"batch {refused.seq} refused: {refused}"
        # once per feed: a hostile engine does not fill the log (the counter and /v1/fleet keep counting)
        (log.warning if self.refused == 1 else log.debug)(
            "KV events of %s: batch %d refused (%s); its blocks are dropped from the index and routing to "
            "it uses the prefix memory; following it again in %.0f s",
            self.url,
            refused.seq,
            refused,
            self.pause,
        )
        self.indexing = False
        self.index.forget(self.url)
        self.last_seq, self._replayed = refused.seq, None
        pause, self.pause = self.pause, min(self.pause * 2, PAUSE_SECONDS[1])
        await asyncio.sleep(pause)
        self.index.watch(self.url)
        self.indexing = True

    async def _session(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sub.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
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
        """One batch into the index, or FeedRefused (nothing an engine sends raises anything else)."""
        try:
            batch = decode_batch(payload)
        except ValueError as exc:
            self.bad += 1
            raise FeedRefused(seq, "undecodable", str(exc)) from None
        try:
            check_batch(batch)
            apply_batch(self.index, self.url, batch)
        except BadKvEvents as exc:
            raise FeedRefused(seq, "out_of_bounds", str(exc)) from None
        except Exception as exc:  # defence in depth: whatever the index cannot take costs this feed only
            raise FeedRefused(seq, "index_error", f"{type(exc).__name__}: {exc}"[:300]) from None
        self.batches += 1
        self.last_seq = seq

    async def _replay(self, start: int) -> None:
        """Ask the engine's replay socket for every batch from `start` it still buffers, and apply them."""
        if self.address.replay is None:
            return
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        dealer.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        first: int | None = None
        count = 0
        try:
            dealer.connect(self.address.replay)
            # a DEALER with no peer yet holds the send: bounded like each answer
            await asyncio.wait_for(dealer.send_multipart([b"", seq_frame(start)]), REPLAY_TIMEOUT_SECONDS)
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT_SECONDS)
                _, seq, payload = parse_published(frames[1:])
                if seq < 0:
                    break
                count += 1
                if count > MAX_REPLAY_BATCHES:
                    why = f"a replay of over {MAX_REPLAY_BATCHES} batches without its end"
                    raise FeedRefused(seq, "replay_too_long", why)
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
            "refused": self.refused,
            "indexing": self.indexing,
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
        refusals: EngineInputRefusals | None = None,
    ) -> None:
        self.index = index
        self.refusals = refusals
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
            feed = self._feeds[endpoint.url] = EngineEvents(
                self._ctx, endpoint, address, self.index, self.refusals
            )
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
        """Whether routing reads `url`'s blocks from the index (its feed is followed and not paused)."""
        feed = self._feeds.get(url)
        return feed is not None and feed.indexing

    def to_json(self, url: str) -> dict[str, Any] | None:
        feed = self._feeds.get(url)
        return None if feed is None else feed.to_json(time.monotonic())

    @property
    def count(self) -> int:
        return len(self._feeds)
