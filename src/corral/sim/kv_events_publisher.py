"""The simulator's KV-event publisher, on the wire as vLLM's ZmqEventPublisher: batches on a PUB socket as
(topic, 8-byte seq, msgpack payload), the last `buffer_steps` of them served again by a ROUTER replay socket.

It runs as two tasks on the engine's event loop, apart from the requests: the prefix cache only appends
events and sets a flag; the publish task takes everything gathered since it last ran as one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

import zmq
import zmq.asyncio

from corral.engine.kv_events import (
    REPLAY_END_SEQ,
    KVEventBatch,
    KvEventsConfig,
    encode_batch,
    seq_frame,
)
from corral.sim.core.cache_events import CacheEvents
from corral.sim.core.logs import EngineLog


def binds(endpoint: str) -> bool:
    """vLLM binds a wildcard, ipc or inproc publisher address and connects to any other."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KvEventPublisher:
    """Publishes what `events` gathers; `start` opens the sockets (a ZMQError when an address is taken)."""

    def __init__(self, config: KvEventsConfig, events: CacheEvents, log: EngineLog) -> None:
        self.config = config
        self.events = events
        self.log = log
        self.published = 0  # batches sent; the next one's seq
        self._topic = config.topic.encode("utf-8")
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._pending = asyncio.Event()
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        ctx = self._ctx = zmq.asyncio.Context()
        try:
            pub = self._pub = ctx.socket(zmq.PUB)
            pub.setsockopt(zmq.LINGER, 0)
            pub.set_hwm(self.config.hwm)
            if binds(self.config.endpoint):
                pub.bind(self.config.endpoint)
            else:
                pub.connect(self.config.endpoint)
            if self.config.replay_endpoint is not None:
                replay = self._replay = ctx.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                replay.bind(self.config.replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self.log.info("EngineCore", "kv_events.py:356", "Starting ZMQ publisher thread")
        self.events.on_pending = self._pending.set
        self._tasks.append(asyncio.create_task(self._publish()))
        if self._replay is not None:
            self._tasks.append(asyncio.create_task(self._serve_replay(self._replay)))

    async def close(self) -> None:
        """Send what is gathered, stop the tasks and close the sockets."""
        self.events.on_pending = lambda: None
        if self._pub is not None:
            await self._send_gathered(self._pub)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
        self._pub = self._replay = self._ctx = None

    async def _publish(self) -> None:
        assert self._pub is not None
        pub = self._pub
        while True:
            await self._pending.wait()
            self._pending.clear()
            await self._send_gathered(pub)

    async def _send_gathered(self, pub: zmq.asyncio.Socket) -> None:
        events = self.events.take()
        if not events:
            return
        payload = encode_batch(KVEventBatch(ts=time.time(), events=events, data_parallel_rank=0))
        seq = self.published
        self.published += 1
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):  # a PUB socket drops past its high-water mark; never waits
            await pub.send_multipart((self._topic, seq_frame(seq), payload), flags=zmq.NOBLOCK)

    async def _serve_replay(self, replay: zmq.asyncio.Socket) -> None:
        while True:
            frames = await replay.recv_multipart()
            if len(frames) != 3:
                self.log.warning("EngineCore", "kv_events.py:512", f"Invalid replay request: {frames}")
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await replay.send_multipart((client, b"", self._topic, seq_frame(seq), payload))
            await replay.send_multipart((client, b"", b"", REPLAY_END_SEQ, b""))
